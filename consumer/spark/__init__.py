"""The PySpark data source ``format("deltamirror")`` (private; :func:`deltamirror.consumer.register`).

source.py (the one module that imports pyspark), options.py, planning.py, rows.py, workers.py.
"""
