"""The sample plan: which sample goes to which rank, worker and batch, as a pure function
of a few integers (seed, epoch, sizes, topology, position). Import the public names from
:mod:`loaderkit`.
"""
