"""The loader: :class:`~loaderkit.ResumableDataLoader` and the engines behind it.

The front end (:mod:`.resumable`) checks arguments and keeps the cursor; the
planned engine (:mod:`._planned`) runs one epoch of a sample plan, the stream
engine (:mod:`._stream`) one pass over a stream of unknown length; both start
and stop worker processes through the one worker module (:mod:`._workers`).

Public names are exported from :mod:`loaderkit`; import them from there.
"""
