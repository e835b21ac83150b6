"""Text embeddings for tool search: `TextEmbedder` turns text into unit vectors with the static
token embeddings (256 dimensions, the `l2_supercat` model) that the `wordllama` package ships in
its wheel, so nothing is downloaded. A text's vector is the mean of its tokens' vectors (as
WordLlama pools), lowercased first, scaled to length 1, so a dot product is a cosine.

Only the package's two files are read (`tokenizers` and `safetensors` load them); `wordllama`
itself is never imported, as its import configures the root logger. `load_embedder` loads the
model once per process and gives None, with one warning, when it cannot (tool search then ranks
by BM25 alone). Imports `numpy`, `tokenizers` and `safetensors`. Exports `TextEmbedder`,
`load_embedder`, `unit_rows`, `MODEL_PACKAGE`, `MODEL_NAME`.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # imported when a model loads: a daemon that never searches never pays
    from tokenizers import Tokenizer

log = logging.getLogger("sidecar.codemode.embedding")

MODEL_PACKAGE = "wordllama"
MODEL_NAME = "l2_supercat_256"
_WEIGHTS = Path("weights") / f"{MODEL_NAME}.safetensors"
_TOKENIZER = Path("tokenizers") / "l2_supercat_tokenizer_config.json"
MAX_CHARS = 4000
"""Text past this many characters is not embedded (a mean over more says little more)."""

Vectors = NDArray[np.float32]


class TextEmbedder:
    """A static embedding model: a token table and its tokenizer. Thread-safe; immutable.
    The table is kept in float32 (32 MB; stored as float16): summing float16 rows costs three
    times as much."""

    __slots__ = ("_table", "_tokenizer", "dimensions")

    def __init__(self, table: Vectors, tokenizer: Tokenizer) -> None:
        self._table = table
        self._tokenizer = tokenizer
        self.dimensions = int(table.shape[1])

    @classmethod
    def from_files(cls, weights: Path, tokenizer: Path) -> TextEmbedder:
        """Load a safetensors token table (`embedding.weight`) and a `tokenizers` JSON file."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        table = load_file(str(weights))["embedding.weight"].astype(np.float32)
        loaded = Tokenizer.from_file(str(tokenizer))
        loaded.no_padding()
        loaded.no_truncation()
        return cls(np.ascontiguousarray(table), loaded)

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One unit vector per text, in order (a text without tokens: the zero vector)."""
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        last_row = self._table.shape[0] - 1
        for i, text in enumerate(texts):
            # one text at a time: a batch would start the tokenizer's thread pool, which a
            # daemon that forks servers is better without
            ids = self._tokenizer.encode(text[:MAX_CHARS].lower(), add_special_tokens=False).ids
            if ids:
                out[i] = self._table[np.minimum(np.asarray(ids, dtype=np.intp), last_row)].sum(0)
        return unit_rows(out)  # the mean's direction: its length does not matter


def unit_rows(vectors: Vectors) -> Vectors:
    """`vectors` with each nonzero row scaled to length 1 (in place)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    vectors /= norms
    return vectors


@functools.cache
def load_embedder(package: str = MODEL_PACKAGE) -> TextEmbedder | None:
    """The model shipped in `package`, loaded once; None (and one warning) when it cannot be."""
    try:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"the package {package!r} is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
        embedder = TextEmbedder.from_files(root / _WEIGHTS, root / _TOKENIZER)
    except Exception as exc:  # any failure: search still works, by words alone
        log.warning("tool search ranks by words alone: its embedding model (%s from %s) did "
                    "not load: %s", MODEL_NAME, package, exc)
        return None
    _one_blas_thread()
    return embedder


def _one_blas_thread() -> None:
    """The process's BLAS on one thread from now on: a search's product (5,000 x 256) runs on
    the event loop, and OpenBLAS's threads, spinning for cores a busy machine does not have,
    made its p99 38 ms instead of 1.4 ms (2026-12-06, load 4-5)."""
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    except Exception as exc:  # slower under load, still correct
        log.info("tool search: the BLAS thread count was left as it is: %s", exc)

