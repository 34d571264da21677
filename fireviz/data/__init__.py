"""Text in, tokens out: bundled corpora, the train/validation split, training windows, synthetic tasks."""

from fireviz.data.corpus import (
    BOS_ID,
    BYTE_VOCAB_SIZE,
    DATA_DIR,
    DOMAINS,
    DataError,
    Document,
    DocumentTokens,
    RawBytesWarning,
    TokenStream,
    data_fingerprint,
    document_tokens,
    load_documents,
    split_documents,
    text_bytes,
)

__all__ = [
    "BOS_ID",
    "BYTE_VOCAB_SIZE",
    "DATA_DIR",
    "DOMAINS",
    "DataError",
    "Document",
    "DocumentTokens",
    "RawBytesWarning",
    "TokenStream",
    "data_fingerprint",
    "document_tokens",
    "load_documents",
    "split_documents",
    "text_bytes",
]
