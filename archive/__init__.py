"""The news image archive (issues #18, #38): every distinct archive image through a news model's
image tower into a FAISS index that grows, shrinks and is served memory-mapped.

``index.py`` is the index (``ArchiveIndex``: add, delete, search, save, load), ``faiss_kinds.py``
each kind's FAISS index and search parameters, ``store.py`` the memory-mappable name tables and
vector file, ``folder.py`` reading a saved folder back, ``calibration.py`` an ivfpq index's
measured search settings, ``build.py`` the streamed, checkpointed and resumable build. It reads a
news model's image tower (``training``) and is read by the served news model (``models``).
"""
