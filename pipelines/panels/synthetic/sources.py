"""The real single-panel figures that synthetic compound figures are made of.

Ground truth is known by construction only if every source really is one panel, and a released
detector may be trained only on what the licences allow: :func:`source_panels` keeps the figures
the concept stage (or, for unlabelled ones, the layout splitter) calls single panel, with their
article's licence, and reads an image from the raw tars only when it is used. Decoding is
deterministic, so :class:`SourceCache` only saves time when sources repeat; it never changes a
sample.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from PIL import Image

from pipelines.images.decode import decode_image

SINGLE_PANEL = "single panel"  # the taxonomy's panel_type of a one-panel figure
MAX_SOURCE_SIDE = 1024  # sources are decoded once and kept at most this large


@dataclass(frozen=True)
class SourcePanel:
    """A real single-panel figure image. ``image`` is its encoded bytes or a function that
    returns them (so a lake's sources are read only when used). ``phash``: its dHash when
    already known (the ``figures`` table has it), else computed when needed."""

    key: str
    image: bytes | Callable[[], bytes]
    license_code: str | None = None
    license_group: str | None = None
    phash: str | None = None

    def read(self) -> bytes:
        return self.image if isinstance(self.image, bytes | bytearray) else self.image()


def load_source(source: SourcePanel) -> Image.Image:
    """The source as an RGB image at most ``MAX_SOURCE_SIDE`` on its long side (ValueError when
    it cannot be decoded)."""
    image, error = decode_image(source.read())
    if image is None:
        raise ValueError(f"source {source.key}: {error}")
    if max(image.size) > MAX_SOURCE_SIDE:
        scale = MAX_SOURCE_SIDE / max(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=2.0)
    return image


class SourceCache:
    """The last ``size`` decoded sources (decoding is deterministic, so caching never changes
    a sample; it only saves time when sources repeat)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._images: OrderedDict[str, Image.Image] = OrderedDict()

    def get(self, source: SourcePanel) -> Image.Image:
        image = self._images.get(source.key)
        if image is None:
            image = self._images[source.key] = load_source(source)
            while len(self._images) > self.size:
                self._images.popitem(last=False)
        else:
            self._images.move_to_end(source.key)
        return image


def source_panels(
    lake,
    release: str,
    shards: Iterable[str],
    commercial_only: bool = False,
    is_single: Callable[[Image.Image], bool] | None = None,
) -> Iterator[SourcePanel]:
    """Single-panel figure images of ``release``'s ``shards``, with their article's licence.

    A figure image is single panel when ``figure_concepts`` says ``panel_type == 'single
    panel'``; a labelled figure of another panel type is skipped; an unlabelled one is kept
    only when ``is_single`` (a layout check on the decoded image) says so, and skipped when no
    check is given. ``commercial_only`` keeps only the ``commercial`` licence group. Images are
    read from the raw tars only when used (the check decodes them once)."""
    from pipelines.core.rawstore import read_raw_file

    for shard in shards:
        tables = {}
        for name in ("articles", "figures", "raw_files", "figure_concepts"):
            found = lake.read_table(name, release, shard)
            tables[name] = found.to_pylist() if found is not None else []
        articles = {r["pmcid"]: r for r in tables["articles"]}
        raw = {(r["pmcid"], r["name"]): r for r in tables["raw_files"]}
        concepts = {(r["pmcid"], r["fig_id"], r["image_file"]): r for r in tables["figure_concepts"]}
        for fig in tables["figures"]:
            article = articles.get(fig["pmcid"])
            if article is None or (commercial_only and article["license_group"] != "commercial"):
                continue
            hashes = fig["phash"] or []
            for index, name in enumerate(fig["image_files"] or []):
                row = raw.get((fig["pmcid"], name))
                if row is None or not row["size"]:
                    continue
                panel_type = (concepts.get((fig["pmcid"], fig["fig_id"], name)) or {}).get("panel_type")
                member = {"tar_path": row["tar_path"], "offset": row["offset"], "size": row["size"]}

                def loader(member=member) -> bytes:
                    return read_raw_file(lake, member)

                if panel_type is not None:
                    if panel_type != SINGLE_PANEL:
                        continue
                elif is_single is None:
                    continue
                else:
                    image, _ = decode_image(loader())
                    if image is None or not is_single(image):
                        continue
                yield SourcePanel(
                    key=f"{fig['pmcid']}/{name}",
                    image=loader,
                    license_code=article["license_code"],
                    license_group=article["license_group"],
                    phash=hashes[index] if index < len(hashes) else None,
                )
