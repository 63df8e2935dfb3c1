"""The Ascend overlay build (`make wheel`) and re-targeting (`make overlay`);
build_overlay.py at the top level is the entry point."""
