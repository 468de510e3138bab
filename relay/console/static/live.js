/* callback-relay console: live counts. Vendored, no dependencies, no build step.
   The page works without it; with it, the numbers of the element marked data-counts are
   refreshed in place from the console's counts endpoint (same session), never as HTML. */
(function () {
  "use strict";
  var live = document.querySelector("[data-counts]");
  if (!live || !window.fetch) {
    return;
  }
  var url = live.getAttribute("data-counts");
  if (url.indexOf("/console/") !== 0) {
    return;
  }
  var every = parseInt(live.getAttribute("data-every"), 10) || 5000;
  every = Math.min(Math.max(every, 1000), 600000);
  var timer = null;

  function show(counts) {
    var fields = live.querySelectorAll("[data-count]");
    for (var i = 0; i < fields.length; i += 1) {
      var value = counts[fields[i].getAttribute("data-count")];
      if (typeof value === "string" && fields[i].textContent !== value) {
        fields[i].textContent = value;
      }
    }
  }

  function poll() {
    if (document.hidden) {
      return;
    }
    fetch(url, {
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error",
      headers: { accept: "application/json" }
    }).then(function (answer) {
      if (answer.status === 403) {
        window.clearInterval(timer); /* logged out: the next click goes to the login */
      }
      return answer.ok ? answer.json() : null;
    }).then(function (counts) {
      if (counts) {
        show(counts);
      }
    }).catch(function () {
      /* a network error: try again at the next tick */
    });
  }

  timer = window.setInterval(poll, every);
}());
