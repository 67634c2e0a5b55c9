// The live part of a job's page: follows the job's event stream and
// redraws its status and progress as they change. Text is only ever set
// as text, never as markup. Without this script the page shows the state
// it was served with.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource) {
    return;
  }
  var source = new EventSource(live.getAttribute("data-events"));

  function text(id, value) {
    var el = document.getElementById(id);
    if (el) {
      el.textContent = value;
    }
  }

  function status(value) {
    var el = document.getElementById("status");
    if (!el) {
      return;
    }
    el.textContent = "";
    var span = document.createElement("span");
    span.className = value;
    span.textContent = value;
    el.appendChild(span);
  }

  function row(cells, numeric) {
    var tr = document.createElement("tr");
    cells.forEach(function (value, i) {
      var td = document.createElement("td");
      if (numeric[i]) {
        td.className = "n";
      }
      td.textContent = value === undefined || value === null ? "" : String(value);
      tr.appendChild(td);
    });
    return tr;
  }

  function progress(p) {
    if (!p) {
      return;
    }
    var streams = document.querySelector("#streams tbody");
    if (streams && p.streams) {
      streams.textContent = "";
      Object.keys(p.streams).sort().forEach(function (name) {
        var s = p.streams[name];
        streams.appendChild(row(
          [name, s.status, s.records_read, s.records, s.bytes, s.records_per_second, s.checkpointed_at || "—"],
          [false, false, true, true, true, true, false]
        ));
      });
    }
    var ledger = document.querySelector("#ledger tbody");
    if (ledger && p.ledger) {
      ledger.textContent = "";
      text("ledger-summary", "Attempt " + p.ledger.attempt + ": " +
        (p.ledger.balanced ? "balanced" : "does not balance"));
      Object.keys(p.ledger.streams).sort().forEach(function (name) {
        var l = p.ledger.streams[name];
        ledger.appendChild(row(
          [name, l.read, l.loaded, l.value_discarded, l.quarantined, l.deduplicated, l.left_to_retry,
            l.unaccounted, (l.snapshot_ids || []).join(" ")],
          [false, true, true, true, true, true, true, true, false]
        ));
      });
    }
    var counts = document.querySelector("#counts tbody");
    if (counts && p.counts) {
      counts.textContent = "";
      Object.keys(p.counts).forEach(function (k) {
        counts.appendChild(row([k, p.counts[k]], [false, true]));
      });
      text("phase", p.phase || "—");
    }
  }

  source.addEventListener("attempt_started", function () {
    status("running");
  });
  source.addEventListener("progress", function (e) {
    var d = JSON.parse(e.data);
    status(d.status);
    progress(d.progress);
  });
  source.addEventListener("finished", function (e) {
    var job = JSON.parse(e.data);
    status(job.status);
    progress(job.progress);
    text("finished", job.finished_at || "—");
    text("error", job.error || "—");
    source.close();
  });
})();
