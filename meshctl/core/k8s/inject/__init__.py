"""Sidecar injection as pure data transformation: the pipeline behind ``meshctl inject``.

validate -> strip any earlier injection -> render -> merge (pipeline.py), over YAML documents
(documents.py) or one AdmissionReview (admission.py). No I/O anywhere in this package.
"""
