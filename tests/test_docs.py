"""The documentation site: every public name on an API page, an offline build, a short README.

The build itself (`mkdocs build --strict`) is `make docs-build`, part of `make test`;
the code blocks of the pages run in tests/test_readme.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import loaderkit

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"


def _mkdocs_config() -> dict:
    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml names Python objects (!!python/name:...), which safe_load refuses.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    Loader.add_constructor("!relative", lambda *_: None)  # mkdocs' path tag
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_every_public_name_is_on_an_api_page() -> None:
    documented: dict[str, str] = {}
    for page in sorted(API.glob("*.md")):
        for identifier in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), flags=re.MULTILINE):
            documented[identifier] = page.name
    names = {identifier.rpartition(".")[2]: identifier for identifier in documented}
    missing = sorted(set(loaderkit.__all__) - set(names))
    assert not missing, f"public names on no API page (docs/api/*.md): {missing}"
    for name, identifier in names.items():
        assert identifier == f"loaderkit.{name}", f"document {name} as loaderkit.{name}"
        assert name in loaderkit.__all__, f"{identifier} on {documented[identifier]} is not public"


def test_every_api_page_is_in_the_nav() -> None:
    nav = repr(_mkdocs_config()["nav"])
    for page in API.glob("*.md"):
        assert f"api/{page.name}" in nav, page.name


def test_the_build_is_offline() -> None:
    """No plugin that fetches at build time (mkdocs-material's social cards and privacy
    plugin download fonts and assets), and no web fonts (the theme fetches Google Fonts)."""
    config = _mkdocs_config()
    plugins = {p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]}
    assert plugins <= {"search", "autorefs", "mkdocstrings"}, plugins
    assert config["theme"]["font"] is False
    assert config["strict"] is True


def test_readme_fits_on_a_few_screens_and_says_how_to_install() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    assert "## Install" in readme and "pip install ." in readme
    for link in re.findall(r"\]\(((?:docs/|CHANGELOG|CONTRIBUTING)[^)#]*)", readme):
        assert (ROOT / link).is_file(), link
