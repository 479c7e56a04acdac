"""The order in which torch's CPU sort leaves equal keys (a pure-Python reproduction).

Upstream EPLB code sorts with ``torch.sort`` / ``torch.argsort`` (``descending=True``),
whose order among equal keys is an artefact of the algorithm; our numpy ports reproduce it
where an engine's output depends on it (SGLang's replica lists).
"""

from __future__ import annotations

__all__ = ["torch_sort_descending"]


def torch_sort_descending(keys) -> list:
    """The order ``torch.sort(descending=True)`` gives one row on the CPU, ties included.

    torch's CPU sort (2.x, ``stable=False``) is libstdc++'s ``std::sort`` over (value, index)
    pairs with the comparator ``a > b``: introsort (median-of-three pivot moved to the
    front, unguarded partition, heapsort below depth ``2 * floor(log2 n)``) on ranges over
    16 items, then one insertion sort. That fixes where equal keys land, which a stable
    sort does not reproduce beyond 16 items. Written from libstdc++'s ``stl_algo.h`` and
    ``stl_heap.h`` (``__introsort_loop``, ``__move_median_to_first``,
    ``__unguarded_partition``, ``__adjust_heap``, ``__final_insertion_sort``).

    Examples
    --------
    >>> torch_sort_descending([3, 1, 3, 2, 3, 1, 1, 2, 3, 3, 1, 2, 2, 3, 1, 1, 3, 2, 2, 3])
    [19, 2, 4, 8, 9, 0, 13, 16, 3, 18, 17, 7, 11, 12, 10, 15, 14, 6, 5, 1]
    """
    key = [float(k) for k in keys]
    a = list(range(len(key)))
    n = len(a)

    def before(x, y):  # the comparator on the items' keys
        return key[x] > key[y]

    def median_to_first(res, i, j, k):
        if before(a[i], a[j]):
            s = j if before(a[j], a[k]) else (k if before(a[i], a[k]) else i)
        elif before(a[i], a[k]):
            s = i
        else:
            s = k if before(a[j], a[k]) else j
        a[res], a[s] = a[s], a[res]

    def partition(first, last, pivot):
        while True:
            while before(a[first], a[pivot]):
                first += 1
            last -= 1
            while before(a[pivot], a[last]):
                last -= 1
            if not first < last:
                return first
            a[first], a[last] = a[last], a[first]
            first += 1

    def adjust_heap(first, hole, length, value):
        top = child = hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if before(a[first + child], a[first + child - 1]):
                child -= 1
            a[first + hole] = a[first + child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            a[first + hole] = a[first + child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and before(a[first + parent], value):
            a[first + hole] = a[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        a[first + hole] = value

    def heap_sort(first, last):
        length = last - first
        for parent in range((length - 2) // 2, -1, -1):
            adjust_heap(first, parent, length, a[first + parent])
        while last - first > 1:
            last -= 1
            value = a[last]
            a[last] = a[first]
            adjust_heap(first, 0, last - first, value)

    def introsort(first, last, depth):
        while last - first > 16:
            if depth == 0:
                heap_sort(first, last)
                return
            depth -= 1
            median_to_first(first, first + 1, first + (last - first) // 2, last - 1)
            cut = partition(first + 1, last, first)
            introsort(cut, last, depth)
            last = cut

    def linear_insert(i):
        value = a[i]
        while before(value, a[i - 1]):
            a[i] = a[i - 1]
            i -= 1
        a[i] = value

    if n > 1:
        introsort(0, n, 2 * (n.bit_length() - 1))
        for i in range(1, n):
            if i < 16 and before(a[i], a[0]):  # guarded insertion into the first 16
                a[: i + 1] = [a[i]] + a[:i]
            else:
                linear_insert(i)
    return a
