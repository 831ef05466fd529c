"""A page's start tags and text, parsed with the standard library: what the HTML report tests read."""

from __future__ import annotations

from html.parser import HTMLParser


class Dom(HTMLParser):
    """Every start tag with its attributes, and the text, of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        """The `tag` elements whose attributes hold each value (`class_="a"`: class contains a)."""
        found = []
        for name, attributes in self.tags:
            if name == tag and all(
                value in (attributes.get(key.rstrip("_").replace("_", "-")) or "").split()
                for key, value in attrs.items()
            ):
                found.append(attributes)
        return found


def parse(page: str) -> Dom:
    dom = Dom()
    dom.feed(page)
    dom.close()
    return dom
