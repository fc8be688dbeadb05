"""`GET /ui`: the status page, static files shipped in the package (no build step, no CDN).

The shell and its assets are served without a key: they hold no data. The page asks for the admin
key and sends it with every JSON request (the same session endpoints a script would use). A strict
Content-Security-Policy allows only these files' own script and style, and connections back here.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

_DIR = Path(__file__).with_name("ui")
_FILES = {  # the only files served: name -> content type
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def is_ui_path(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def _responder(body: bytes, content_type: str) -> web.Response:
    return web.Response(body=body, headers={**HEADERS, "Content-Type": content_type})


def add_routes(app: web.Application) -> None:
    """The files are read once here (a few KB): serving them never touches the disk."""
    files = {name: ((_DIR / name).read_bytes(), kind) for name, kind in _FILES.items()}

    async def index(request: web.Request) -> web.Response:
        return _responder(*files["index.html"])

    async def asset(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return _responder(*found)

    app.router.add_get("/ui", index)
    app.router.add_get("/ui/", index)
    app.router.add_get("/ui/{name}", asset)
