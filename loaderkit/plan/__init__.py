"""The sample plan: which sample goes to which rank and batch, as a pure function of a few
integers. Import the public names from :mod:`loaderkit`."""
