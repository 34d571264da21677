"""Issue #38: names drawn in figures are plain text. Plotly renders a subset of HTML in labels
(``<a href>``, ``<b>``…), so a checkpoint called ``<a href=…>`` became a link in a legend."""

from __future__ import annotations

from plotly.subplots import make_subplots

from fireviz import plots

EVIL = '<a href="http://example.com">x</a> & <b>y</b>'
SHOWN = '&lt;a href="http://example.com"&gt;x&lt;/a&gt; &amp; &lt;b&gt;y&lt;/b&gt;'


def _figure():
    fig = make_subplots(rows=1, cols=2, subplot_titles=[EVIL, "layer 0"])
    fig.add_scatter(x=[1], y=[1], name=EVIL, text=[EVIL], hovertext=EVIL, row=1, col=1)
    fig.add_scatter(x=[1], y=[2], name="alibi", row=1, col=2)
    fig.update_layout(title=dict(text=f"vs {EVIL}<br>second line", subtitle=dict(text=EVIL)))
    fig.update_yaxes(title_text=f"bits per byte − {EVIL}", row=1, col=2)
    return fig


def test_every_label_is_plain_text_and_line_breaks_stay():
    fig = plots.plain_labels(_figure())
    assert fig.data[0].name == SHOWN and list(fig.data[0].text) == [SHOWN] and fig.data[0].hovertext == SHOWN
    assert fig.data[1].name == "alibi"
    assert fig.layout.title.text == f"vs {SHOWN}<br>second line"
    assert fig.layout.title.subtitle.text == SHOWN
    assert fig.layout.yaxis2.title.text == f"bits per byte − {SHOWN}"
    assert [a.text for a in fig.layout.annotations] == [SHOWN, "layer 0"]


def test_a_second_pass_changes_nothing():
    once = plots.plain_labels(_figure()).to_plotly_json()
    assert plots.plain_labels(plots.plain_labels(_figure())).to_plotly_json() == once


def test_figures_written_to_files_are_plain_text_too(tmp_path):
    """A breaker's finding: the CLI's --figure wrote a checkpoint named <a href=…> as a live link
    (only the app escaped names). Every file fireviz writes goes through plain_labels; the figure
    passed in is left as it was."""
    fig = _figure()
    html = plots.write_figure(fig, tmp_path / "f.html").read_text()
    assert "<a href" not in html and "\\u003ca href" not in html and "&lt;a href" in html
    assert fig.data[0].name == EVIL  # the caller's figure is not changed
