// Goodput Recovery Console: keeps the incident list live (no framework, no build step).
(function () {
  "use strict";
  var rows = document.getElementById("incident-rows");
  var live = document.getElementById("live");
  if (!rows || !live) { return; }
  var every = 1000 * (parseInt(live.getAttribute("data-interval"), 10) || 5);
  function refresh() {
    if (document.visibilityState !== "visible") { return; }
    var params = new URLSearchParams(window.location.search);
    params.set("fragment", "rows");
    fetch(window.location.pathname + "?" + params.toString(), { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.text(); })
      .then(function (html) {
        rows.innerHTML = html;  // server-rendered, autoescaped, same origin
        var first = rows.querySelector("[data-total]");
        var count = document.getElementById("incident-count");
        if (first && count) { count.textContent = first.getAttribute("data-total"); }
        live.textContent = "live · " + new Date().toLocaleTimeString();
        live.className = "live";
      })
      .catch(function () { live.textContent = "live (retrying)"; live.className = "live stale"; });
  }
  window.setInterval(refresh, every);
})();
