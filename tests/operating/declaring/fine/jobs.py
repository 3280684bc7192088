"""A jobs module that imports fine and declares nothing."""
