"""Front ends: where layer specs come from. Hugging Face ``config.json`` files (and the bundled
zoo), spec files, and scans of ``torch.nn.Module`` trees.

Configs and spec files are read without torch; only a module scan needs it.
"""
