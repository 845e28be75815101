"""The loader: :class:`~loaderkit.ResumableDataLoader` and the engines behind it (planned,
stream, iterable). Import the public names from :mod:`loaderkit`.
"""
