//! The README and `docs/` as one navigable set (issue 33): every relative link in README.md
//! and docs/*.md reaches a file that exists, every `#anchor` a heading of that file (GitHub's
//! slug rule), every docs page is linked from the README, and the README stays short enough
//! to be read by the person installing the runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The README is for installing; everything else belongs to a docs page.
const README_MAX_LINES: usize = 250;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, relative to the repository root.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of a Markdown text outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match fence {
            Some(f) if t.starts_with(f) => fence = None,
            Some(_) => {}
            None if t.starts_with("```") => fence = Some("```"),
            None if t.starts_with("~~~") => fence = Some("~~~"),
            None => out.push((n + 1, line)),
        }
    }
    out
}

/// `line` without its inline code spans (a run of N backticks up to the next run of N).
fn without_code_spans(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let n = b[i..].iter().take_while(|&&c| c == b'`').count();
            let open = "`".repeat(n);
            if let Some(end) = line[i + n..].find(&open) {
                i += n + end + n;
                continue;
            }
            out.push_str(&line[i..i + n]);
            i += n;
            continue;
        }
        let c = line[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Targets of inline links `[text](target)` in one line of prose (code spans removed).
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                out.push(after[..end].trim().to_string());
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's anchor for a heading: the rendered text lower-cased, everything but letters,
/// digits, `_`, `-` and spaces dropped, each space a `-`.
fn slug(heading: &str) -> String {
    // Rendered text: a link shows its text only.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](").and_then(|m| {
            let close = rest[open + m..].find(')')?;
            Some((open + m, open + m + close))
        }) {
            Some((mid, close)) => {
                text.push_str(&rest[..open]);
                text.push_str(&rest[open + 1..mid]);
                rest = &rest[close + 1..];
            }
            None => break,
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown text's headings get, duplicates numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.bytes().take_while(|&c| c == b'#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(title);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| target.starts_with(p))
}

/// Every broken relative link of `file` (relative to the repository root), as messages.
fn broken_links(file: &Path) -> Vec<String> {
    let text = fs::read_to_string(root().join(file)).unwrap();
    let dir = file.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (n, line) in prose_lines(&text) {
        for target in link_targets(line) {
            if is_external(&target) {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.to_path_buf()
            } else {
                dir.join(path)
            };
            let at = format!("{}:{n}: ({target})", file.display());
            if !root().join(&linked).exists() {
                broken.push(format!("{at}: no file {}", linked.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let Ok(linked_text) = fs::read_to_string(root().join(&linked)) else {
                    broken.push(format!("{at}: {} is not a text file", linked.display()));
                    continue;
                };
                if !anchors(&linked_text).contains(anchor) {
                    broken.push(format!(
                        "{at}: no heading with the anchor #{anchor} in {}",
                        linked.display()
                    ));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_reaches_a_file_and_heading() {
    let files = markdown_files();
    assert!(files.len() > 1, "no docs/*.md found: {files:?}");
    let broken: Vec<String> = files.iter().flat_map(|f| broken_links(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_docs_page_is_linked_from_the_readme() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<PathBuf> = prose_lines(&readme)
        .iter()
        .flat_map(|(_, l)| link_targets(l))
        .filter(|t| !is_external(t))
        .map(|t| PathBuf::from(t.split('#').next().unwrap()))
        .collect();
    let missing: Vec<String> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with("docs") && !linked.contains(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "docs pages the README does not link: {missing:?}"
    );
}

#[test]
fn the_readme_is_at_most_250_lines() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move reference material to docs/"
    );
}

#[test]
fn slugs_follow_github_s_rule() {
    assert_eq!(
        slug("The host's /dev/char links"),
        "the-hosts-devchar-links"
    );
    assert_eq!(slug("`NVIDIA_REQUIRE_*`"), "nvidia_require_");
    assert_eq!(
        slug("Strategies on containerd 2's CRI (measured)"),
        "strategies-on-containerd-2s-cri-measured"
    );
    assert_eq!(
        slug("See [the docs](docs/README.md) now"),
        "see-the-docs-now"
    );
    assert_eq!(slug("Fish & chips"), "fish--chips");
    let twice = anchors("# A\n\n## A\n\n```\n# not a heading\n```\n### A\n");
    assert_eq!(
        twice,
        ["a", "a-1", "a-2"].iter().map(|s| s.to_string()).collect()
    );
}

#[test]
fn links_in_code_are_not_links() {
    assert_eq!(
        link_targets("[`config.toml`](../config/config.toml) and `[x](nowhere)`"),
        vec!["../config/config.toml"]
    );
    assert!(link_targets("`[profiles.<name>]` (default)").is_empty());
}
