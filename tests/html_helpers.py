"""Reading HTML back in the tests: the tables of a page, cell by cell (html.parser)."""

from __future__ import annotations

from html.parser import HTMLParser

ANSI = "\x1b["


class Page(HTMLParser):
    """Every table as rows of cells ({"tag", "text"}; entities decoded, so "&lt;" reads "<"),
    and every tag seen. Rows and cells outside a table are ignored."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: list[list[list[dict]]] = []
        self.tags: list[str] = []
        self.cell: dict | None = None
        self.depth = 0  # tables open
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
            self.depth += 1
        elif tag == "tr" and self.depth:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.depth and self.tables[-1]:
            self.cell = {"tag": tag, "text": ""}

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.tables[-1][-1].append(self.cell)
            self.cell = None
        elif tag == "table" and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.cell is not None:
            self.cell["text"] += data


def texts(row: list[dict]) -> list[str]:
    return [c["text"] for c in row]
