"""Wire schemas and protocols, sans I/O: the supervisor channel, ZDS, HBONE, and what a packet
capture shows.
"""
