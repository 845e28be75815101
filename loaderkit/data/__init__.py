"""Datasets and the readers behind them; import the public names from :mod:`loaderkit`."""
