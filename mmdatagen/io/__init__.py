"""Writers, readers and the manifest."""
