"""The operator's pages' style sheet and their one script (every page of ``airflow.ui`` uses
both: the Dead letters page, the list and one dead letter, the app's own answers)."""

STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#1a202c}
table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #cbd5e0;padding:4px 10px;text-align:left;vertical-align:top}th{background:#edf2f7}
td.n{text-align:right;font-variant-numeric:tabular-nums}
h1{font-size:22px}h2{font-size:18px;margin:28px 0 4px}.muted{color:#718096}
.row{display:flex;flex-wrap:wrap;gap:12px 28px;align-items:flex-start}
section.group{border-top:1px solid #e2e8f0;margin-top:16px}
div.paused{background:#fff5f5;border:1px solid #feb2b2;border-left:6px solid #e53e3e;padding:8px 12px;
margin:0 0 10px;max-width:1100px}
form.filter{margin:8px 0}form.filter input{width:240px}
form.filter button{background:#2b6cb0;color:#fff;border:0;padding:5px 12px;border-radius:4px;
cursor:pointer}
ul.refused{margin:8px 0;padding-left:20px;max-width:1100px}
ul.refused li{font-family:ui-monospace,monospace;margin:2px 0;overflow-wrap:anywhere}"""

# A link to a page of the Airflow UI (data-top). The UI shows this page in an iframe sandboxed
# without allow-top-navigation, so such a link cannot take the UI there by itself: a click makes
# the same link in the top document and clicks that one (a link of the top document is navigated
# by the top document; see redelivery.airflow.ui.app). Opened top-level, links work as links.
TOP_LINKS = """<script>document.addEventListener("click", function (e) {
  var a = e.target.closest && e.target.closest("a[data-top]");
  if (!a || window.top === window) return;
  e.preventDefault();
  var top = window.top.document.createElement("a");
  top.href = a.href;
  window.top.document.body.appendChild(top);
  top.click();
});</script>"""
