//! The plan's web page (`autopar plan --html`, `autopar train --report`) opened in a real
//! headless browser: it renders every picture without a script error, its tables sort by a
//! click, and it fetches nothing. The browser is Chromium (`chromium` on the PATH, or the
//! program `AUTOPAR_CHROMIUM` names); without one these tests say so and pass, unless
//! `AUTOPAR_REQUIRE_BROWSER` is set (the project's CI sets it and installs Chromium).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn autopar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).args(args).output().unwrap()
}

/// The browser, or None (the test then passes, saying why) unless one is required.
fn chromium() -> Option<PathBuf> {
    let named = std::env::var_os("AUTOPAR_CHROMIUM").map(PathBuf::from);
    let found = named.or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()))
        })
    });
    if found.is_none() {
        assert!(std::env::var_os("AUTOPAR_REQUIRE_BROWSER").is_none(), "AUTOPAR_REQUIRE_BROWSER is set but no chromium was found");
        eprintln!("no chromium on the PATH: the page is not opened in a browser (install chromium to run this check)");
    }
    found
}

/// The page's DOM after it loaded and its scripts ran, as the browser dumps it.
fn rendered(browser: &Path, page: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish rendering {} in 120 s", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "chromium failed on {}", page.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of attribute `name` on the dumped page's body.
fn body_attribute(dom: &str, name: &str) -> Option<String> {
    let body = &dom[dom.find("<body")?..];
    let body = &body[..body.find('>')?];
    let at = body.find(&format!("{name}=\""))? + name.len() + 2;
    Some(body[at..at + body[at..].find('"')?].to_string())
}

/// A page with `script` run after its own.
fn with_script(page: &Path, script: &str, dir: &Path, name: &str) -> PathBuf {
    let html = std::fs::read_to_string(page).unwrap();
    let at = html.rfind("</body>").unwrap();
    let out = dir.join(name);
    std::fs::write(&out, format!("{}<script>{script}</script>{}", &html[..at], &html[at..])).unwrap();
    out
}

/// Fetches nothing: no external script, style, image or frame.
fn assert_self_contained(html: &str) {
    for needle in ["<link", " src=", "@import", "url(http", "href=\"http"] {
        assert!(!html.contains(needle), "the page refers to something outside it: {needle}");
    }
    let outside = html.matches("http").count();
    let namespaces = html.matches("http://www.w3.org/2000/svg").count();
    assert_eq!(outside, namespaces, "the only addresses are SVG's namespace");
}

fn planned_page(dir: &Path, args: &[&str]) -> PathBuf {
    let page = dir.join("plan.html");
    let mut all = vec!["plan", "--html", page.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = autopar(&all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    page
}

#[test]
fn the_plan_page_renders_in_a_browser_and_its_tables_sort() {
    let dir = tempfile::tempdir().unwrap();
    let page = planned_page(dir.path(), &["--model", "gpt", "--devices", "8", "--parallel-mode", "semi_auto_parallel"]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert_self_contained(&html);
    for section in
        ["id=\"summary\"", "id=\"memory\"", "id=\"operators-table\"", "id=\"parameters-table\"", "id=\"redistributions\"", "<svg"]
    {
        assert!(html.contains(section), "the page lacks {section}");
    }
    // Every rank's memory: a row per rank.
    let memory = &html[html.find("id=\"memory-table\"").unwrap()..];
    assert_eq!(memory[..memory.find("</table>").unwrap()].matches("<tr>").count(), 1 + 8);
    let Some(browser) = chromium() else { return };
    let dom = rendered(&browser, &page);
    assert_eq!(body_attribute(&dom, "data-errors"), None, "script errors");
    assert_eq!(body_attribute(&dom, "data-rendered").as_deref(), Some("yes"));
    assert_eq!(body_attribute(&dom, "data-pictures").as_deref(), Some("1"));
    // Two clicks on the FLOPs column: its rows largest first.
    let click = "var h = Array.prototype.find.call(document.querySelectorAll('#operators-table th'), function (t) { return t.textContent.indexOf('FLOPs') >= 0; }); h.click(); h.click();";
    let dom = rendered(&browser, &with_script(&page, click, dir.path(), "sorted.html"));
    let table = &dom[dom.find("id=\"operators-table\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    let values: Vec<f64> = table
        .split("<tr")
        .skip(2)
        .map(|row| {
            let at = row.find("data-v=\"").unwrap() + 8;
            row[at..at + row[at..].find('"').unwrap()].parse().unwrap()
        })
        .collect();
    assert!(values.len() > 100, "{} rows", values.len());
    assert!(values.windows(2).all(|w| w[0] >= w[1]), "not sorted largest first: {values:?}");
    assert!(values[0] > *values.last().unwrap());
    assert!(table.contains("aria-sort=\"descending\""));
}

#[test]
fn a_script_error_on_the_page_is_caught() {
    // The check the tests above rely on: an error thrown on the page is reported.
    let dir = tempfile::tempdir().unwrap();
    let page = planned_page(dir.path(), &["--model", "mlp", "--devices", "2"]);
    let Some(browser) = chromium() else { return };
    let broken = with_script(&page, "undefinedFunction();", dir.path(), "broken.html");
    let dom = rendered(&browser, &broken);
    assert!(body_attribute(&dom, "data-errors").is_some_and(|e| e.contains("undefinedFunction")), "{dom:.300}");
}

#[test]
fn a_pipeline_page_shows_its_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let page = planned_page(dir.path(), &["--model", "mlp", "--devices", "8", "--parallel", "pipeline_stages=2", "--rank", "5"]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert_self_contained(&html);
    assert!(html.contains("id=\"pipeline\""));
    assert!(html.contains("schedule"));
    // Groups in world ranks: rank 5's stage holds ranks 4 to 7; the split picture says its
    // ranks are positions in a stage.
    assert!(html.contains("position 1 of each parameter's stage") && html.contains("4 ranks [4, 5, 6, 7]"), "{html}");
    assert!(html.contains("its ranks numbered by their position in the stage"));
    let Some(browser) = chromium() else { return };
    let dom = rendered(&browser, &page);
    assert_eq!(body_attribute(&dom, "data-errors"), None);
    assert_eq!(body_attribute(&dom, "data-rendered").as_deref(), Some("yes"));
    assert_eq!(body_attribute(&dom, "data-pictures").as_deref(), Some("2"));
}

#[test]
fn a_training_run_writes_the_page_with_what_it_measured() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("run.html");
    let out = autopar(&[
        "train",
        "--model",
        "mlp",
        "--data",
        "synthetic",
        "--devices",
        "2",
        "--steps",
        "6",
        "--log-every",
        "0",
        "--eval",
        "false",
        "--report",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_self_contained(&html);
    let measured = &html[html.find("id=\"measured\"").expect("the measured section")..];
    let measured = &measured[..measured.find("</table>").unwrap()];
    for row in ["step time", "memory of this process (2 ranks)", "median of the 5 steps after the first", "peak resident (VmHWM)"] {
        assert!(measured.contains(row), "{row} missing: {measured}");
    }
    // The ranks' predicted memory adds up to the plan the run holds itself to.
    let values = |table: &str| -> Vec<Vec<f64>> {
        let t = &html[html.find(&format!("id=\"{table}\"")).unwrap()..];
        let t = &t[..t.find("</table>").unwrap()];
        t.split("<tr")
            .skip(2)
            .map(|row| row.split("data-v=\"").skip(1).map(|v| v.split('"').next().unwrap().parse().unwrap()).collect())
            .collect()
    };
    let per_rank: f64 = values("memory-table").iter().map(|row| row.last().unwrap()).sum();
    let plan = values("measured-table")[1][0];
    assert_eq!(per_rank, plan, "the ranks' memory against the plan's");
    // The loss curve: a point per step.
    let curve = &html[html.find("loss per step").unwrap()..];
    let points = curve.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
    assert_eq!(points.split(' ').count(), 6);
    let Some(browser) = chromium() else { return };
    let dom = rendered(&browser, &page);
    assert_eq!(body_attribute(&dom, "data-errors"), None);
    assert_eq!(body_attribute(&dom, "data-rendered").as_deref(), Some("yes"));
}

#[test]
fn an_unwritable_page_is_refused_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), "").unwrap();
    let page = dir.path().join("file/plan.html");
    let out = autopar(&["plan", "--model", "mlp", "--devices", "2", "--html", page.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--html") && err.contains("is a file, not a folder") && err.contains("hint:"), "{err}");
    // A training run refuses it before it trains.
    let page = page.to_str().unwrap();
    let out = autopar(&["train", "--model", "mlp", "--data", "synthetic", "--steps", "1", "--report", page]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--report") && err.contains("is a file, not a folder") && !err.contains("trained"), "{err}");
}
