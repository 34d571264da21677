"""fireviz: position encodings and long-context generalization, made visible.

Library layout follows the data flow, each module importing only those before it: ``encodings`` → ``model`` →
``train``; ``evaluate``, ``analysis``, ``fit``; ``plots``; the Streamlit app on top.
"""

__version__ = "0.1.0"
