"""Shipping: what turns a verified program into something people use, and how they drive it.

==========  ===========================================================================
``wheel``   a program folder -> a Python-version-independent wheel (plus the runtime's
            own small wheel) that runs with NumPy, CuPy or PyTorch arrays and no PyTorch
``loader``  the runtime wheel's ``stitchrt`` package (ctypes over the program ABI, DLPack)
``bench``   a suite run (or resumed) into a results folder, with its summary
``suite``   what a suite is; how one problem becomes one result line
``workers`` where the problems run: a worker process per GPU, longest first, or Ray tasks
``report``  the suite's report.md / report.html and its plots (matplotlib)
``doctor``  what this machine has and lacks, each with the fix
``errors``  exit codes; every failure as one line
``ui``      progress, tables and json output of the command
==========  ===========================================================================
"""
