"""Which files ``POST /admin/weights`` may load: only regular files inside the configured folder.

The endpoint hands a client-given path to ``torch.load``. Unchecked, a bad path answered a 500
(``IsADirectoryError``, ``IndexError``) whose difference from a 400 told the caller whether a file
existed anywhere on the machine. Here the path is resolved (symbolic links followed) and compared
with the folder before anything is read: a path outside it gets one 403 whatever it names, so
nothing about the rest of the file system leaks; inside it, a missing file or a folder is a 400.
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning_rl.gateway.protocol import GatewayHTTPError

__all__ = ["weights_file"]


def weights_file(path: object, folder: str | None) -> Path:
    """The resolved file that the client's ``path`` (relative to ``folder``, or absolute) names inside
    ``folder`` (``GatewayConfig.weights_dir``; ``None`` refuses every path), else a 400 or 403."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise GatewayHTTPError(
            400, "'path' must be the name of a weights file (a state dict saved with torch.save).", param="path"
        )
    if folder is None:
        raise GatewayHTTPError(
            403,
            "this gateway loads no weights files: start it with a weights folder "
            "(GatewayConfig.weights_dir, lightning-rl gateway serve --weights-dir) and save them there.",
            type="permission_error",
            param="path",
            code="weights_dir_not_set",
        )
    root = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(root / path))  # an absolute ``path`` replaces ``root`` here
    if target == root or root not in target.parents:
        raise GatewayHTTPError(
            403,
            "'path' is outside the gateway's weights folder; save the weights there and name them relative to it.",
            type="permission_error",
            param="path",
            code="path_not_allowed",
        )
    if not target.is_file():
        raise GatewayHTTPError(
            400,
            f"no weights file {target.relative_to(root).as_posix()!r} in the weights folder.",
            param="path",
            code="weights_not_found",
        )
    return target
