"""rcp11: a Redis-protocol server for antirez's RCP 11 stream data type.

Importing the package loads nothing else: rcp11.client needs no C and no
server code.
"""

__version__ = "0.1.0"
