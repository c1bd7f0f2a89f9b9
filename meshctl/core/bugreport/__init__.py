"""``meshctl bug-report`` as values: redaction of what it collects, the pods' roles, the archive's
layout and size budget, and the summary a maintainer reads first. Pure: the plugin collects
and writes; everything here takes what was collected and returns text or data.
"""
