"""The page's layout and look: Grafana's 24-column grid, its dark theme, and the widths of the
text it writes (the legends and the axes are laid out before the browser draws them)."""

from __future__ import annotations

# Grafana's grid: 24 columns, rows 30 px high, 8 px between panels.
GRID_ROW, GRID_GAP, PAGE_PAD = 30, 8, 16
PANEL_HEADER = 32
# Grafana's dark theme.
BG, PANEL_BG, BORDER = "#111217", "#181b1f", "rgba(204,204,220,0.12)"
TEXT, TEXT_DIM, LINK = "#ccccdc", "rgba(204,204,220,0.65)", "#6e9fff"
GRID_LINE = "rgba(240,250,255,0.09)"
NAMED_COLORS = {"green": "#73BF69", "red": "#F2495C", "orange": "#FF9830", "yellow": "#FADE2A",
                "blue": "#5794F2", "purple": "#B877D9", "text": TEXT}
PALETTE = ("#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#705DA0",
           "#37872D", "#FADE2A", "#447EBC", "#F79420", "#E02F44", "#1F60C4", "#8F3BB8", "#96D98D")
FONT = "Inter, Helvetica, Arial, 'Liberation Sans', sans-serif"
#: Character widths (thousandths of the font size) of Arial, whose metrics Liberation Sans shares: for
#: the layout of legends and axes, which has to be known before the browser draws the text.
WIDTHS = {
    **dict.fromkeys("ijl|", 222), **dict.fromkeys(" .:/ft", 278), **dict.fromkeys("-()r", 333),
    **dict.fromkeys("cksvxyzJ", 500), **dict.fromkeys("FTZ", 611), **dict.fromkeys("ABEKPSVXY", 667),
    **dict.fromkeys("CDHNRUw", 722), **dict.fromkeys("GOQ", 778), **dict.fromkeys("mM", 833),
    "W": 944, "I": 278, "L": 556,
}


def text_width(text: str, size: float = 12) -> float:
    return sum(WIDTHS.get(char, 556) for char in text) * size / 1000


def column_width(page_width: int) -> float:
    """One of the grid's 24 columns, on a page ``page_width`` pixels wide."""
    return (page_width - 2 * PAGE_PAD - 23 * GRID_GAP) / 24


def panel_width(gridpos: dict[str, int], page_width: int) -> int:
    column = column_width(page_width)
    return round(gridpos["w"] * column + (gridpos["w"] - 1) * GRID_GAP)
