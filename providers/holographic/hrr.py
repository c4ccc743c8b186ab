"""Phase holographic reduced representations (HRR), vectorised with numpy.

A vector is ``dim`` phase angles in [0, 2π). The algebra:

* ``bind(a, b) = (a + b) mod 2π`` — a composite dissimilar to both inputs;
* ``unbind(m, k) = (m − k) mod 2π`` — exact inverse of bind, so
  ``unbind(bind(a, b), a) == b`` and, inside a bundle, ≈ b plus noise;
* ``bundle(v₁ … vₙ) = angle(Σ e^{i·vⱼ})`` — similar to every member;
* ``similarity(a, b) = mean(cos(a − b))`` in [-1, 1]; unrelated vectors score
  ≈ 0 ± 1/√(2·dim).

Phase encoding keeps every component on the unit circle, so repeated bundling never
collapses magnitudes the way real-valued HRRs do.

Atoms are derived from SHA-256, not from a random generator, so the same word gives
the same vector on every machine and every numpy version: block ``i`` is
``sha256(f"{word}:{i}")``, read as 16 little-endian uint16 values scaled by 2π/65536,
blocks concatenated and truncated to ``dim``. Because atoms are multiples of
2π/65536 they survive the uint16 storage format (``to_blob``) exactly; bundles lose
at most π/65536 per component there, far below the noise floor.

Capacity: a bundle of ``n`` bound pairs answers an unbind query with signal-to-noise
ratio ≈ √(dim/n) (``capacity_snr``, the conventional estimate; warn below 2 — more
than 256 items at dim 1024). For *phase* vectors the ratio is a constant √(π/2) ≈ 1.25
better: the bundle's normalisation by |Σ| leaves the wanted term a mean cosine of
≈ √(π/(4n)) while an unrelated vector scores with spread 1/√(2·dim).
``expected_recall`` turns the estimate into a predicted nearest-neighbour accuracy, so
the estimate is checked by measurement (tests and ``bench/holographic.py``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np

TWO_PI = 2.0 * math.pi
_SCALE = TWO_PI / 65536.0
_VALUES_PER_BLOCK = 16  # a 32-byte digest holds 16 uint16 values

DEFAULT_DIM = 1024
MIN_DIM = 64
MAX_DIM = 16384
SNR_WARNING = 2.0


def _check_dim(dim: int) -> int:
    if not isinstance(dim, int) or not MIN_DIM <= dim <= MAX_DIM:
        raise ValueError(f"dim must be an integer in [{MIN_DIM}, {MAX_DIM}], got {dim!r}")
    return dim


@lru_cache(maxsize=65536)
def _atom_cached(word: str, dim: int) -> np.ndarray:
    blocks = math.ceil(dim / _VALUES_PER_BLOCK)
    raw = b"".join(hashlib.sha256(f"{word}:{i}".encode()).digest() for i in range(blocks))
    values = np.frombuffer(raw, dtype="<u2")[:dim]
    phases = values.astype(np.float64) * _SCALE
    phases.setflags(write=False)  # shared through the cache: nobody may mutate it
    return phases


@lru_cache(maxsize=65536)
def _phasor_cached(word: str, dim: int) -> np.ndarray:
    p = np.exp(1j * _atom_cached(word, dim))
    p.setflags(write=False)
    return p


def encode_atom(word: str, dim: int = DEFAULT_DIM) -> np.ndarray:
    """The deterministic phase vector of ``word`` (read-only, cached)."""
    return _atom_cached(word, _check_dim(dim))


def atoms(words: Sequence[str], dim: int = DEFAULT_DIM) -> np.ndarray:
    """Atoms of several words as one ``(len(words), dim)`` matrix."""
    _check_dim(dim)
    if not words:
        return np.zeros((0, dim))
    return np.stack([_atom_cached(w, dim) for w in words])


def bind(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.mod(a + b, TWO_PI)
    return out


def unbind(memory: np.ndarray, key: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.mod(memory - key, TWO_PI)
    return out


def phasors(vectors: np.ndarray) -> np.ndarray:
    """``e^{i·v}``: the unit-circle form that bundling and similarity work on."""
    out: np.ndarray = np.exp(1j * np.asarray(vectors, dtype=np.float64))
    return out


def bundle(vectors: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """Superpose vectors (rows of a matrix, or a sequence of vectors) into one.

    An empty input has no direction; it raises rather than inventing one.
    """
    m = np.asarray(vectors, dtype=np.float64)
    if m.ndim == 1:
        m = m[None, :]
    if m.shape[0] == 0:
        raise ValueError("cannot bundle zero vectors")
    return phase_of(phasors(m).sum(axis=0))


def phase_of(phasor_sum: np.ndarray) -> np.ndarray:
    """The phase vector of an (unnormalised) sum of phasors."""
    out: np.ndarray = np.mod(np.angle(phasor_sum), TWO_PI)
    return out


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.cos(a - b)))


def similarities(matrix: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``similarity(row, v)`` for every row of ``matrix``, in one pass."""
    m = np.asarray(matrix, dtype=np.float64)
    if m.shape[0] == 0:
        return np.zeros(0)
    out: np.ndarray = np.cos(m - v).mean(axis=1)
    return out


# cos of every uint16 phase step: the similarity of stored codes is a table lookup.
_COS_TABLE = np.cos(np.arange(65536) * _SCALE).astype(np.float32)


def code_similarities(codes: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``similarity(row, v)`` for every row of a uint16 code matrix (stored vectors).

    The difference of two codes wraps modulo 65536 exactly as phases wrap modulo 2π,
    so one subtraction and one table lookup replace a cosine per component.
    """
    if codes.shape[0] == 0:
        return np.zeros(0)
    q = (np.rint(np.mod(v, TWO_PI) / _SCALE).astype(np.int64) % 65536).astype(np.uint16)
    out: np.ndarray = _COS_TABLE[codes - q].mean(axis=1, dtype=np.float64)
    return out


def similarity_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise similarities of the rows of ``a`` and ``b`` via one complex matmul.

    mean(cos(x − y)) = Re(mean(e^{ix} · conj(e^{iy}))).
    """
    pa, pb = phasors(a), phasors(b)
    out: np.ndarray = (pa @ pb.conj().T).real / a.shape[1]
    return out


PHASE_GAIN = math.sqrt(math.pi / 2.0)


def capacity_snr(dim: int, n: int) -> float:
    """Signal-to-noise ratio of retrieving one of ``n`` bundled items: √(dim/n).

    Conservative for phase vectors, whose measured ratio is ``PHASE_GAIN`` times this.
    """
    _check_dim(dim)
    if n <= 0:
        return math.inf
    return math.sqrt(dim / n)


def capacity_warning(dim: int, n: int) -> bool:
    """True when ``n`` items in one bundle push the estimate below ``SNR_WARNING``."""
    return capacity_snr(dim, n) < SNR_WARNING


def expected_recall(dim: int, n: int, candidates: int) -> float:
    """Predicted probability that unbinding one of ``n`` bundled pairs returns a value
    whose nearest neighbour among ``candidates`` codebook entries (the right one
    included) is the right one.

    Model: similarities are normal with unit spread; the right entry sits
    ``PHASE_GAIN · capacity_snr`` spreads above ``candidates − 1`` independent
    distractors.
    P = ∫ φ(z) Φ(z + snr)^(candidates−1) dz, integrated numerically.
    """
    if candidates <= 1:
        return 1.0
    snr = PHASE_GAIN * capacity_snr(dim, n)
    if math.isinf(snr):
        return 1.0
    z = np.linspace(-8.0, 8.0, 4001)
    pdf = np.exp(-0.5 * z * z) / math.sqrt(TWO_PI)
    cdf = 0.5 * (1.0 + _erf((z + snr) / math.sqrt(2.0)))
    integrand = pdf * np.power(cdf, candidates - 1)
    return float(np.trapezoid(integrand, z))


_erf = np.vectorize(math.erf, otypes=[np.float64])


def encode_text(words: Iterable[str], dim: int = DEFAULT_DIM) -> np.ndarray | None:
    """Bundle of the distinct words' atoms, or None for no words at all."""
    distinct = sorted(set(words))
    if not distinct:
        return None
    return bundle(atoms(distinct, dim))


ROLE_CONTENT = "__role:content__"
ROLE_ENTITY = "__role:entity__"


def entity_key(entity: str, dim: int = DEFAULT_DIM) -> np.ndarray:
    """``bind(atom(entity), ROLE_ENTITY)``: what a fact vector holds per entity."""
    return bind(encode_atom(entity.lower(), dim), encode_atom(ROLE_ENTITY, dim))


def encode_fact(terms: Iterable[str], entities: Iterable[str], dim: int = DEFAULT_DIM) -> np.ndarray:
    """Fact vector = bundle(bind(text, ROLE_CONTENT), bind(atom(e), ROLE_ENTITY) …),
    where text is the bundle of the fact's distinct content terms.

    Computed on cached unit phasors, where bind is a product and bundle a normalised
    sum — the same vector as composing ``bind``/``bundle`` on phases, without an
    ``exp`` per call (this is the hot path of every insert).
    """
    _check_dim(dim)
    parts: list[np.ndarray] = []
    distinct = sorted(set(terms))
    if distinct:
        text = np.sum([_phasor_cached(w, dim) for w in distinct], axis=0)
        parts.append(_unit(text) * _phasor_cached(ROLE_CONTENT, dim))
    for e in sorted({e.lower() for e in entities}):
        parts.append(_phasor_cached(e, dim) * _phasor_cached(ROLE_ENTITY, dim))
    if not parts:
        # A fact with no words at all still needs a stable vector.
        parts.append(_phasor_cached(ROLE_CONTENT, dim))
    return phase_of(np.sum(parts, axis=0))


def _unit(z: np.ndarray) -> np.ndarray:
    """z/|z|, with a zero sum taken as phase 0 (what ``np.angle`` gives it)."""
    mag = np.abs(z)
    out: np.ndarray = np.divide(z, mag, out=np.ones_like(z), where=mag > 0)
    return out


def content_key(query_words: Iterable[str], dim: int = DEFAULT_DIM) -> np.ndarray | None:
    """The query-side counterpart of a fact's content part."""
    text = encode_text(query_words, dim)
    if text is None:
        return None
    return bind(text, encode_atom(ROLE_CONTENT, dim))


def to_blob(vector: np.ndarray) -> bytes:
    """Store phases as little-endian uint16 (2 bytes per component)."""
    q = np.rint(np.mod(vector, TWO_PI) / _SCALE).astype(np.int64) % 65536
    data: bytes = q.astype("<u2").tobytes()
    return data


def from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<u2").astype(np.float64) * _SCALE


def from_blobs(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Many stored vectors as one ``(n, dim)`` matrix (one decode, no Python loop per value)."""
    if not blobs:
        return np.zeros((0, dim))
    raw = np.frombuffer(b"".join(blobs), dtype="<u2")
    return raw.reshape(len(blobs), dim).astype(np.float64) * _SCALE


def codes_from_blobs(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Stored vectors as a ``(n, dim)`` uint16 code matrix, undecoded."""
    if not blobs:
        return np.zeros((0, dim), dtype=np.uint16)
    return np.frombuffer(b"".join(blobs), dtype="<u2").reshape(len(blobs), dim).astype(np.uint16)


def phasor_to_blob(phasor_sum: np.ndarray) -> bytes:
    return np.asarray(phasor_sum, dtype="<c16").tobytes()


def phasor_from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<c16").copy()
