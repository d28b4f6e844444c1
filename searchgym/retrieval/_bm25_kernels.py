"""The compiled BM25 top-k: the pruned term-at-a-time search of :meth:`BM25Retriever.top_k`, in numba.

Imported only by :func:`searchgym.retrieval.bm25.numba_kernel`, the first time a query needs it, and only
when numba is installed: ``import searchgym`` never imports numba. Every function is compiled with
``cache=True``: the first process on a machine compiles them (seconds) and writes the machine code next to
this file (``__pycache__``) or under ``NUMBA_CACHE_DIR``; later processes load it from there instead.

The algorithm is the numpy path's (see :meth:`BM25Retriever.top_k`) and returns the same thing to the
last bit: posting lists are added shortest first into a dense accumulator until the k-th best touched
passage beats the bounds of the terms left (MaxScore), the terms left are looked up for the surviving
candidates only, and the survivors are scored exactly, their query's tokens added in query order from 0.0
as the full sparse product adds them. Where it differs is in what is cheap once compiled: the touched
passages are listed while they are few, and once the lists would touch a quarter of the corpus the
accumulator is read whole instead (a sequential read beats gathering from a long list); a stop is taken
only when fewer candidates survive than the next list holds (looking a list up for every survivor would
read more than adding it). Each posting costs a few nanoseconds and each query a few microseconds besides.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Relative margin of the pruning comparisons (the numpy path's ``_MARGIN``).
MARGIN = 1e-9


@njit(cache=True, nogil=True)
def _offer(heap: np.ndarray, size: int, k: int, value: float) -> int:  # pragma: no cover
    """Offers ``value`` to ``heap``, a min-heap of the ``k`` largest values offered; returns its new size."""
    if size < k:
        j = size
        heap[j] = value
        while j > 0:
            parent = (j - 1) >> 1
            if heap[parent] <= heap[j]:
                break
            heap[parent], heap[j] = heap[j], heap[parent]
            j = parent
        return size + 1
    if value > heap[0]:
        heap[0] = value  # replace the smallest and sift it down
        j = 0
        while True:
            child = 2 * j + 1
            if child >= k:
                break
            if child + 1 < k and heap[child + 1] < heap[child]:
                child += 1
            if heap[j] <= heap[child]:
                break
            heap[j], heap[child] = heap[child], heap[j]
            j = child
    return size


@njit(cache=True, nogil=True)
def _kth_largest(values: np.ndarray, n: int, k: int, heap: np.ndarray) -> float:  # pragma: no cover
    """The ``k``-th largest of ``values[:n]`` (``-inf`` when ``n < k``)."""
    size = 0
    for i in range(n):
        if size < k or values[i] > heap[0]:  # the common case, a value below the k-th, costs one compare
            size = _offer(heap, size, k, values[i])
    return heap[0] if size == k else -np.inf


@njit(cache=True, nogil=True)
def _kth_of_candidates(
    acc: np.ndarray, cand: np.ndarray, n: int, k: int, heap: np.ndarray, left: float
) -> tuple[float, int]:  # pragma: no cover
    """The ``k``-th largest partial score ``acc[cand[c]]`` of the ``n`` candidates (``-inf`` when ``n < k``),
    and how many candidates reach the running k-th best with ``left`` added (a bound on the survivors)."""
    size = 0
    reach = 0
    floor = -np.inf
    for c in range(n):
        a = acc[cand[c]]
        if size < k or a > heap[0]:
            size = _offer(heap, size, k, a)
            if size == k:
                floor = heap[0] * (1 - MARGIN) - MARGIN
        if a + left >= floor:
            reach += 1
    return (heap[0] if size == k else -np.inf), reach


@njit(cache=True, nogil=True)
def _dense_pass(
    acc: np.ndarray, left: float, k: int, heap: np.ndarray, out: np.ndarray, limit: int
) -> tuple[int, float]:  # pragma: no cover
    """One read of the whole accumulator: the ``k``-th best partial score over the passages scoring above 0
    (``-inf`` when fewer than ``k`` do), and in ``out``, by ascending position, a superset of the passages
    above 0 whose partial score plus ``left`` reaches it (the running k-th best only grows). Returns
    ``(count written, k-th best)``, or ``(limit + 1, -inf)`` as soon as more than ``limit`` are written.
    """
    size = 0
    n = 0
    floor = -np.inf
    for d in range(acc.shape[0]):
        a = acc[d]
        if (size == k and a + left < floor) or a <= 0.0:  # most passages: one well-predicted branch
            continue
        if size < k or a > heap[0]:
            size = _offer(heap, size, k, a)
            if size == k:
                floor = heap[0] * (1 - MARGIN) - MARGIN
        if a + left >= floor:
            if n == limit:
                return n + 1, -np.inf
            out[n] = d
            n += 1
    return n, (heap[0] if size == k else -np.inf)


@njit(cache=True, nogil=True)
def _gather(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    term: int,
    docs: np.ndarray,
    n: int,
    out: np.ndarray,
) -> None:  # pragma: no cover
    """``out[s] = w(term, docs[s])`` for the ``n`` ascending ``docs`` (``nan`` where the term is absent).

    A galloping search from the last hit: a few steps per passage when they are few, a walk through the
    list when they are many.
    """
    lo, end = indptr[term], indptr[term + 1]
    for s in range(n):
        d = docs[s]
        hi, step = lo, 1
        while hi < end and indices[hi] < d:  # everything before lo is below d
            lo = hi + 1
            hi = lo + step
            step <<= 1
        hi = min(hi, end)
        while lo < hi:
            mid = (lo + hi) >> 1
            if indices[mid] < d:
                lo = mid + 1
            else:
                hi = mid
        out[s] = data[lo] if lo < end and indices[lo] == d else np.nan


@njit(cache=True, nogil=True)
def _select(
    positions: np.ndarray, scores: np.ndarray, n: int, k: int, out_pos: np.ndarray, out_score: np.ndarray
) -> int:  # pragma: no cover
    """The best ``k`` of ``n`` entries listed by ascending position and scoring above 0: by decreasing
    score, ties by lower position (a later entry enters only by scoring strictly more). Returns the count."""
    count = 0
    for i in range(n):
        s = scores[i]
        if s > 0.0:
            count = _insert(positions[i], s, count, k, out_pos, out_score)
    return count


@njit(cache=True, nogil=True)
def _insert(
    position: int, score: float, count: int, k: int, out_pos: np.ndarray, out_score: np.ndarray
) -> int:  # pragma: no cover
    """Offers ``(position, score)`` to the top ``k`` held in ``out_*[:count]`` (by decreasing score; an
    equal score never displaces an entry already there, offered earlier); returns the new count."""
    if count == k and score <= out_score[k - 1]:
        return count
    j = count if count < k else k - 1
    while j > 0 and out_score[j - 1] < score:
        out_score[j] = out_score[j - 1]
        out_pos[j] = out_pos[j - 1]
        j -= 1
    out_score[j] = score
    out_pos[j] = position
    return count + 1 if count < k else count


@njit(cache=True, nogil=True)
def _fill_zeros(count: int, k: int, out_pos: np.ndarray, out_score: np.ndarray) -> None:  # pragma: no cover
    """Completes a top ``k`` of ``count`` positive entries with the lowest positions not in it, scoring 0."""
    p = 0
    while count < k:
        taken = False
        for j in range(count):
            if out_pos[j] == p:
                taken = True
                break
        if not taken:
            out_pos[count] = p
            out_score[count] = 0.0
            count += 1
        p += 1


@njit(cache=True, nogil=True)
def _full_scores(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    terms: np.ndarray,
    k: int,
    acc: np.ndarray,
    out_pos: np.ndarray,
    out_score: np.ndarray,
) -> None:  # pragma: no cover
    """Top ``k`` by full scoring (weights may be negative): every token's list added in query order."""
    n_docs = acc.shape[0]
    for i in range(terms.shape[0]):
        t = terms[i]
        for p in range(indptr[t], indptr[t + 1]):
            acc[indices[p]] += data[p]
    count = 0
    for d in range(n_docs):  # by ascending position: a tie never displaces an earlier passage
        count = _insert(d, acc[d], count, k, out_pos, out_score)
    acc[:] = 0.0


@njit(cache=True, nogil=True)
def _one_query(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    upper: np.ndarray,
    terms: np.ndarray,
    k: int,
    acc: np.ndarray,
    cand: np.ndarray,
    heap: np.ndarray,
    out_pos: np.ndarray,
    out_score: np.ndarray,
) -> None:  # pragma: no cover
    """Top ``k`` of one query (term ids in query order, at least one), weights all ``>= 0``."""
    unique = np.unique(terms)
    m = unique.shape[0]
    counts = np.zeros(m, dtype=np.int64)
    slot = np.searchsorted(unique, terms)  # each token's distinct term
    for i in range(terms.shape[0]):
        counts[slot[i]] += 1
    df = np.empty(m, dtype=np.int64)
    bounds = np.empty(m, dtype=np.float64)
    for u in range(m):
        df[u] = indptr[unique[u] + 1] - indptr[unique[u]]
        bounds[u] = counts[u] * upper[unique[u]]
    # Shortest lists first; among equal lengths, the larger bound first (as the numpy path orders them).
    order = np.arange(m)
    for a in range(1, m):
        u = order[a]
        b = a
        while b > 0 and (
            df[order[b - 1]] > df[u] or (df[order[b - 1]] == df[u] and bounds[order[b - 1]] < bounds[u])
        ):
            order[b] = order[b - 1]
            b -= 1
        order[b] = u
    rest = np.zeros(m + 1, dtype=np.float64)  # rest[i]: the bounds of the terms order[i:]
    for i in range(m - 1, -1, -1):
        rest[i] = rest[i + 1] + bounds[order[i]]

    # 1. Whole posting lists into the accumulator, shortest first, until no untouched passage can reach the
    #    top k. The passages touched are listed (cand) while few; once the lists would touch a quarter
    #    of the corpus, the accumulator is read whole instead (dense), which costs less than listing.
    n_docs = acc.shape[0]
    n_cand = 0
    dense = False
    n_pass = 0  # dense: the superset of survivors written into cand by the last pass
    added = 0
    kth = -np.inf
    for i in range(m):
        u = order[i]
        lo, hi = indptr[unique[u]], indptr[unique[u] + 1]
        if not dense and n_cand + (hi - lo) >= n_docs // 4:
            dense = True
        # The check reads every candidate (or the whole accumulator): it runs only before a list at least
        # that long. A relative margin absorbs rounding: bounds and partial scores are sums in other orders.
        if dense and i > 0:
            # Stopping leaves the terms left to be looked up for each survivor (a search each), which is
            # worth it only when the survivors are far fewer than the next list's postings: the pass gives
            # up as soon as they are not.
            n_pass, kth = _dense_pass(acc, rest[i], k, heap, cand, (hi - lo) // 8)
            if kth > rest[i] * (1 + MARGIN) + MARGIN:
                break
        elif not dense and n_cand >= k and hi - lo >= n_cand:
            kth, reach = _kth_of_candidates(acc, cand, n_cand, k, heap, rest[i])
            # Not when more candidates would survive than the next list holds: adding it reads less.
            if kth > rest[i] * (1 + MARGIN) + MARGIN and reach < hi - lo:
                break
        weight_count = counts[u]
        if dense:
            for p in range(lo, hi):
                acc[indices[p]] += weight_count * data[p]
        else:
            for p in range(lo, hi):
                w = data[p]
                if w > 0.0:  # a passage is touched once its partial score is above 0 (weights are >= 0)
                    d = indices[p]
                    a = acc[d]
                    if a == 0.0:
                        cand[n_cand] = d
                        n_cand += 1
                    acc[d] = a + weight_count * w
        added = i + 1
    left = rest[added]
    if added == m:  # every list added (no early stop): the final k-th best partial score
        if dense:
            n_pass, kth = _dense_pass(acc, left, k, heap, cand, n_docs)
        else:
            kth = _kth_of_candidates(acc, cand, n_cand, k, heap, 0.0)[0]

    # 2. The passages that can still reach the k-th best partial score, by ascending position. Passages at
    #    0 cannot (a stop needs the k-th best above the bounds left; with every list added they score 0).
    floor = kth * (1 - MARGIN) - MARGIN
    if dense:
        survivors = np.empty(n_pass, dtype=np.int64)
        n_surv = 0
        for c in range(n_pass):
            d = cand[c]
            if acc[d] + left >= floor:
                survivors[n_surv] = d
                n_surv += 1
    else:
        survivors = np.empty(n_cand, dtype=np.int64)
        n_surv = 0
        for c in range(n_cand):
            d = cand[c]
            if acc[d] > 0.0 and acc[d] + left >= floor:
                survivors[n_surv] = d
                n_surv += 1
    survivors = survivors[:n_surv]
    if not dense:
        survivors = np.sort(survivors)
    scores = np.empty(n_surv, dtype=np.float64)
    for s in range(n_surv):
        scores[s] = acc[survivors[s]]
    if dense:  # leave the scratch zeroed for the next query
        acc[:] = 0.0
    else:
        for c in range(n_cand):
            acc[cand[c]] = 0.0

    # 3. The terms not added, largest bound first, looked up for the survivors only; after each, the
    #    survivors that can no longer reach the k-th best partial score are dropped.
    pending = order[added:].copy()
    for a in range(1, pending.shape[0]):
        u = pending[a]
        b = a
        while b > 0 and bounds[pending[b - 1]] < bounds[u]:
            pending[b] = pending[b - 1]
            b -= 1
        pending[b] = u
    found = np.empty(n_surv, dtype=np.float64)
    for u in pending:
        if n_surv <= k:
            break  # every survivor is in the top k: only their exact scores are left to compute
        _gather(indptr, indices, data, unique[u], survivors, n_surv, found)
        for s in range(n_surv):
            if found[s] == found[s]:  # not nan: present
                scores[s] += counts[u] * found[s]
        left = max(left - bounds[u], 0.0)
        kth = max(kth, _kth_largest(scores, n_surv, k, heap))
        floor = kth * (1 - MARGIN) - MARGIN
        kept = 0
        for s in range(n_surv):
            if scores[s] + left >= floor:
                survivors[kept] = survivors[s]
                scores[kept] = scores[s]
                kept += 1
        n_surv = kept

    # 4. Exact scores of the survivors: each token's weight added in query order, from 0.0.
    weights = np.empty((m, n_surv), dtype=np.float64)
    for u in range(m):
        _gather(indptr, indices, data, unique[u], survivors, n_surv, weights[u])
    for s in range(n_surv):
        total = 0.0
        for i in range(terms.shape[0]):
            w = weights[slot[i], s]
            if w == w:
                total += w
        scores[s] = total
    count = _select(survivors, scores, n_surv, k, out_pos, out_score)
    # Fewer than k passages score above 0 (every term was then added and they all survived): the rest of
    # the top k are passages scoring 0, by position.
    _fill_zeros(count, k, out_pos, out_score)


@njit(cache=True, nogil=True)
def top_k_batch(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    upper: np.ndarray,
    nonnegative: bool,
    query_ptr: np.ndarray,
    query_terms: np.ndarray,
    k: int,
    acc: np.ndarray,
    cand: np.ndarray,
    out_pos: np.ndarray,
    out_score: np.ndarray,
) -> None:  # pragma: no cover
    """The top ``k`` of each query of a batch, written into ``out_pos`` and ``out_score``.

    Args:
        indptr: ``(V + 1,)`` row pointers of the ``(V, N)`` weight matrix.
        indices: ``(nnz,)`` passage of each posting, sorted within each row.
        data: ``(nnz,)`` float64 weight of each posting.
        upper: ``(V,)`` largest weight of each term (0 for an empty row).
        nonnegative: Whether every weight is ``>= 0`` (else every query is scored in full).
        query_ptr: ``(B + 1,)`` start of each query in ``query_terms``.
        query_terms: The queries' term ids in query order, repeats kept.
        k: Passages per query, ``1 <= k <= N``.
        acc: ``(N,)`` float64 scratch, all zero (left zero).
        cand: ``(N,)`` int64 scratch (the passages a query touches).
        out_pos: ``(B, k)`` int64 output positions, best first.
        out_score: ``(B, k)`` float64 output scores.
    """
    heap = np.empty(k, dtype=np.float64)
    for q in range(query_ptr.shape[0] - 1):
        terms = query_terms[query_ptr[q] : query_ptr[q + 1]]
        if terms.shape[0] == 0:  # every passage scores 0: the first k
            for j in range(k):
                out_pos[q, j] = j
                out_score[q, j] = 0.0
        elif not nonnegative:
            _full_scores(indptr, indices, data, terms, k, acc, out_pos[q], out_score[q])
        else:
            _one_query(indptr, indices, data, upper, terms, k, acc, cand, heap, out_pos[q], out_score[q])
