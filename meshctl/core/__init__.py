"""The pure core: values in, values out. No sockets, subprocesses, asyncio, env or files here."""
