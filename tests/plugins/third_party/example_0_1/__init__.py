"""A plugin written against kvcore 0.1, frozen (see each module's first comment)."""
