// The Idem console's only script: pages marked data-refresh reload their
// content in place every few seconds (nothing else runs; the pages work
// without it).
(function () {
  "use strict";
  var every = Number(document.body && document.body.dataset.refresh);
  if (!every) return;
  function refresh() {
    if (document.hidden) return;
    // Not while someone is choosing a filter.
    var active = document.activeElement;
    if (active && active.closest && active.closest("form")) return;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (text) {
        if (!text) return;
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("content");
        var current = document.getElementById("content");
        if (fresh && current) current.replaceWith(fresh);
      })
      .catch(function () {});
  }
  window.setInterval(refresh, every);
})();
