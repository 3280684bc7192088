"""A pausable TCP proxy: a network partition between one process and its database.

:class:`PausableProxy` listens on a free loopback port and forwards every connection to a
target (the database server). :meth:`~PausableProxy.pause` stops forwarding in both
directions without closing anything: bytes already read wait in the proxy, nothing more is
read, so the sockets fill up and the client's queries hang as they do when a network drops
packets (no RST, no FIN). A connection opened meanwhile is accepted but its bytes wait too.
:meth:`~PausableProxy.resume` forwards again (the partition heals);
:meth:`~PausableProxy.close` ends every connection. It runs an asyncio loop in a thread of
its own::

    proxy = PausableProxy("127.0.0.1", 5432)
    proxy.start()                     # proxy.port: where the partitioned process connects
    proxy.pause(); ...; proxy.resume()
    proxy.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class PausableProxy:
    """Forward TCP connections from ``127.0.0.1:port`` to ``host:target_port``, pausably."""

    def __init__(self, host: str, target_port: int) -> None:
        self.host, self.target_port = host, target_port
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        #: The local ports of the proxy's connections to the target (the server sees the
        #: partitioned process's sessions coming from them).
        self.upstream_ports: set[int] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)

    def start(self) -> int:
        """Start listening and forwarding; return the port to connect to."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self.port

    async def _listen(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        port = up_writer.get_extra_info("sockname")[1]
        self._writers |= {writer, up_writer}
        self.upstream_ports.add(port)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        self._writers -= {writer, up_writer}
        self.upstream_ports.discard(port)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                await self._open.wait()  # paused: hold the bytes, read nothing more
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

    def _call(self, function: object) -> None:
        self._loop.call_soon_threadsafe(function)  # type: ignore[arg-type]

    def pause(self) -> None:
        """Stop forwarding (a partition): nothing is closed, every byte waits."""
        self._call(self._open.clear)

    def resume(self) -> None:
        """Forward again (the partition heals)."""
        self._call(self._open.set)

    def close(self) -> None:
        """End every connection and stop the proxy."""

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
