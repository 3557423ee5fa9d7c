"""The news image archive (issues #18, #38): every distinct archive image through a news model's
image tower into a FAISS index that grows, shrinks and is served memory-mapped. It reads a news
model's image tower (``training``) and is read by the served news model (``models``); one line
per module: docs/architecture.md.
"""
