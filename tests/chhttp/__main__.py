"""``python -m tests.chhttp``: serve a chdb data directory over ClickHouse's HTTP interface.

Test fixture, not a product part. Prints ``chhttp ready http://HOST:PORT`` once it
accepts connections; SIGTERM or SIGINT stop it cleanly (the engine is closed, data kept).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from tests.chhttp.server import ChServer, Engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chhttp", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (loopback)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 = any free port")
    parser.add_argument("--path", type=Path, required=True, help="chdb data directory")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = parser.parse_args(argv)

    engine = Engine(args.path)
    server = ChServer((args.host, args.port), engine, verbose=args.verbose)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f"chhttp ready http://{host}:{port} path={engine.path}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
