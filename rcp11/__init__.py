"""rcp11: a Redis-protocol server for antirez's RCP 11 stream data type.

Importing the package loads nothing else: rcp11.client needs no C and no
server code.
"""

# The one place the version is written: pyproject.toml reads it from here
# (setuptools' dynamic `attr`), the server, INFO and the CLIs import it.
__version__ = "0.1.0"
