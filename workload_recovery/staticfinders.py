"""Static assets taken from installed Python packages, so the Console needs no CDN.

plotly.js comes from the plotly package itself: the chart library in the browser is the one the
server-side figures were built for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, overload

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Error
from django.core.files.storage import FileSystemStorage

PACKAGED_ASSETS: dict[str, Path] = {
    "vendor/plotly/plotly.min.js": Path(plotly.__file__).parent / "package_data" / "plotly.min.js",
}


class PackagedAssetStorage(FileSystemStorage):
    """One asset file under the URL path the Console asks for."""

    def __init__(self, url_path: str, source: Path) -> None:
        super().__init__(location=str(source.parent))
        self.prefix = str(Path(url_path).parent)
        self._name = source.name


class PackageAssetFinder(BaseFinder):
    def check(self, **kwargs: Any) -> list[CheckMessage]:
        return [
            Error(f"Static asset {url_path} is missing: {source} does not exist.")
            for url_path, source in PACKAGED_ASSETS.items()
            if not source.is_file()
        ]

    @overload
    def find(self, path: str, find_all: Literal[False] = False) -> str | None: ...

    @overload
    def find(self, path: str, find_all: Literal[True]) -> list[str]: ...

    # Django 5.2 still passes the deprecated ``all`` keyword to finders that take it.
    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str] | None:
        source = PACKAGED_ASSETS.get(path)
        if source is None or not source.is_file():
            return [] if find_all or kwargs.get("all") else ""
        return [str(source)] if find_all or kwargs.get("all") else str(source)

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        for url_path, source in PACKAGED_ASSETS.items():
            if source.is_file():
                yield source.name, PackagedAssetStorage(url_path, source)
