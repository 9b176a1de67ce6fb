"""Data files shipped with kvcore: ``zoo/`` holds published model configs (see its SOURCES.md)."""
