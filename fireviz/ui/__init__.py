"""The app's Streamlit helpers — the only place in fireviz that imports Streamlit (this package).

What lives here (and nothing that computes a bias or a loss):
  * page setup and per-page widget keys (``key(page, name)`` → ``"<page>_<name>"``);
  * page state in the URL: ``url_state`` seeds a widget from ``st.query_params`` once per
    session and ``sync_url`` writes the widgets' values back, so a view is a shareable link;
    ``fit_param_input`` makes such a widget of a fit target's ``FitParam``;
  * checkpoints: the cached list under the checkpoints root (``FIREVIZ_CHECKPOINTS_DIR``),
    a picker that also takes a local folder or a Hugging Face repo id, and cached models
    (``st.cache_resource``, keyed by the checkpoint's identity, ``picker.checkpoint_sha256``);
  * figures with their captions, and CSV/JSON downloads of the plotted numbers.
Errors from the library are shown with ``st.error`` naming the problem and the fix; the
app keeps running.
"""

from __future__ import annotations

from fireviz.checkpoints import catalog as ck
from fireviz.eval import MAX_UPLOAD_MB, UPLOAD_TYPES, save_upload
from fireviz.model import CheckpointError
from fireviz.plots.presentation import (
    fit_file_stem,
    format_params,
    human_count,
    int_values,
    job_error_text,
    locality_rules_text,
    locality_summary_rows,
    parse_lengths,
    percent,
    perplexity_table,
    pool_seeds,
    rows_to_csv,
    split_errors,
    to_json,
)
from fireviz.ui.background import EvalSpec, eval_caption, eval_spec, evaluation_jobs, job_panel, resolve_checkpoints
from fireviz.ui.figures import (
    MAX_QUERY_POSITION,
    attention_pattern,
    bias_report,
    documents,
    downloads,
    figure_downloads,
    figure_table_downloads,
    normalizer_cap_input,
    show_figure,
)
from fireviz.ui.picker import (
    HOME_DETAIL_COLUMNS,
    causal_lm,
    checkpoint_caption,
    checkpoint_groups,
    checkpoint_picker,
    checkpoint_table_config,
    checkpoint_warnings,
    checkpoints_root,
    current_group,
    group_label,
    group_picker,
    group_root,
    list_checkpoints,
    load_causal_lm,
    load_model,
    no_checkpoints_message,
    reads_bytes,
    resolve,
    text_tokenizer,
)
from fireviz.ui.state import (
    EXTRA_KEY,
    GROUP_KEY,
    error,
    fit_param_input,
    follow_default,
    key,
    plain,
    setup_page,
    sync_url,
    table_height,
    url_state,
)
