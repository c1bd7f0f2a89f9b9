"""Sidecar injection as pure data transformation: the pipeline behind ``meshctl inject``.

validate -> strip any earlier injection -> render -> merge (pipeline.py, over validation.py,
removal.py, render.py, merge.py and the undo record between them, undo.py), over YAML documents
(documents.py) or one AdmissionReview (admission.py). No I/O anywhere in this package.
"""
