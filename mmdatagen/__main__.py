"""``python -m mmdatagen``."""
from .cli import main

main()
