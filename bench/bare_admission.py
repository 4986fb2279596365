"""The webhook benchmark's baseline: a bare aiohttp handler over TLS that answers every POST with the
request's own AdmissionReview body, unchanged. Whatever the real webhook costs on top of this is its own
work (parsing, mutation, patch, logging, metrics).

    python -m bench.bare_admission --port 9443 --cert tls.crt --key tls.key
"""

from __future__ import annotations

import argparse
import asyncio
import ssl

from aiohttp import web


async def echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.Response(body=body, content_type="application/json")


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/{tail:.*}", echo)
    return app


async def serve_low_level(host: str, port: int, ctx: ssl.SSLContext) -> None:
    """The same echo on aiohttp's low-level server (``web.Server``, no Application layer), as tf-webhook
    serves: what the Application layer alone costs."""
    runner = web.ServerRunner(web.Server(echo, access_log=None))
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ctx).start()
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--low-level", action="store_true", help="serve on web.Server, not web.Application")
    args = parser.parse_args(argv)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)
    # the event loop tf-webhook runs on (extender/eventloop.py), so the ratio compares handlers, not loops
    try:
        import uvloop
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    if args.low_level:
        loop.run_until_complete(serve_low_level(args.host, args.port, ctx))
        return
    web.run_app(make_app(), host=args.host, port=args.port, ssl_context=ctx, access_log=None,
                print=None, loop=loop)


if __name__ == "__main__":
    main()
