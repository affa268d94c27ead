"""A TCP forwarder that SIGKILLs itself mid-stream: a replica dying under a real engine's stream.

``python -m tests.backends.forwarder LISTEN_PORT TARGET_PORT KILL_AFTER_BYTES`` listens on 127.0.0.1 and
forwards every connection to 127.0.0.1:TARGET_PORT. On the first connection whose request is a
``POST /v1/chat/completions``, once KILL_AFTER_BYTES bytes of the response went back to the client, the
process kills itself with SIGKILL: the kernel closes its sockets, as it does for a replica that dies, so the
client sees the stream end mid-body. Health checks and other requests pass through untouched.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, budget: int | None) -> None:
    sent = 0
    try:
        while data := await reader.read(65536):
            if budget is not None and sent + len(data) >= budget:
                writer.write(data[: max(budget - sent, 0)])
                await writer.drain()
                os.kill(os.getpid(), signal.SIGKILL)
            writer.write(data)
            await writer.drain()
            sent += len(data)
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(listen: int, target: int, kill_after: int) -> None:
    armed = [True]

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        upstream_r, upstream_w = await asyncio.open_connection("127.0.0.1", target)
        head = await client_r.read(65536)
        budget = None
        if armed[0] and head.startswith(b"POST /v1/chat/completions"):
            armed[0], budget = False, kill_after
        upstream_w.write(head)
        await asyncio.gather(_pipe(client_r, upstream_w, None), _pipe(upstream_r, client_w, budget))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
