"""MkDocs hooks (mkdocs.yml ``hooks``): the repository's README.md is the site's home page.

README.md stays at the repository's root, where GitHub and the package's long description show it,
and links to the pages as ``docs/<page>.md``; the pages link back to it as ``../README.md``. On the
site README.md is ``index.md``, beside the pages, so both kinds of link are rewritten to match."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    readme = Path(config.config_file_path).parent / "README.md"
    files.append(File.generated(config, "index.md", abs_src_path=str(readme)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        return markdown.replace("](docs/", "](")
    return markdown.replace("](../README.md", "](index.md")
