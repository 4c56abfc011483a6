//! docs/reasons.md is the one reference for verdict reasons: its table must list exactly the
//! reasons `reasons!` declares, each with the action it gets, so that a reason cannot be added,
//! renamed or moved to another action without the reference saying so.

use std::collections::BTreeMap;

use kxdp_dataplane::verdict::Reason;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reasons.md");

/// The rows of the file's reason tables (those whose header's first cell is `Reason`):
/// `| `code` | action | ...`, keyed by code. Other tables (the actions, ...) are not read.
fn documented(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut rows = BTreeMap::new();
    // Whether the table the current line belongs to is a reason table.
    let mut in_reasons = false;
    let mut in_table = false;
    for (n, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        // "| a | b |" splits into ["", "a", "b", ""].
        if cells.len() < 4 || !cells[0].is_empty() {
            in_table = false;
            continue;
        }
        if !in_table {
            in_table = true;
            in_reasons = cells[1] == "Reason";
            continue;
        }
        if !in_reasons {
            continue;
        }
        let Some(code) = cells[1]
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .filter(|c| !c.contains('`'))
        else {
            continue;
        };
        let action = cells[2].trim_matches('`').to_string();
        if rows.insert(code.to_string(), action).is_some() {
            return Err(format!(
                "docs/reasons.md line {}: `{code}` listed twice",
                n + 1
            ));
        }
    }
    Ok(rows)
}

#[test]
fn reasons_doc_lists_every_reason_with_its_action() {
    let text = std::fs::read_to_string(DOC).unwrap_or_else(|e| panic!("reading {DOC}: {e}"));
    let rows = documented(&text).unwrap_or_else(|e| panic!("{e}"));

    let missing: Vec<&str> = Reason::ALL
        .iter()
        .map(|r| r.as_str())
        .filter(|c| !rows.contains_key(*c))
        .collect();
    let extra: Vec<&str> = rows
        .keys()
        .map(String::as_str)
        .filter(|c| Reason::from_code(c).is_none())
        .collect();
    let wrong_action: Vec<String> = Reason::ALL
        .iter()
        .filter_map(|r| {
            let doc = rows.get(r.as_str())?;
            (doc != r.action().as_str()).then(|| {
                format!(
                    "`{}` is {} in the code, {doc} in the doc",
                    r.as_str(),
                    r.action().as_str()
                )
            })
        })
        .collect();

    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!(
            "missing from the table (declared in dataplane/src/verdict.rs `reasons!`): {}",
            missing.join(", ")
        ));
    }
    if !extra.is_empty() {
        problems.push(format!(
            "in the table but not declared in `reasons!`: {}",
            extra.join(", ")
        ));
    }
    if !wrong_action.is_empty() {
        problems.push(format!("wrong action: {}", wrong_action.join("; ")));
    }
    assert!(
        problems.is_empty(),
        "docs/reasons.md does not match the `reasons!` list:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_row_parser_reads_reason_rows_only() {
    let rows = documented(
        "| Action | What |\n| --- | --- |\n| `drop` | freed |\n\n\
         | Reason | Action |\n| --- | --- |\n| `direct` | forward | x |\n| `a` and `b` | drop | y |\n\
         | `malformed` | drop |\n",
    )
    .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows["direct"], "forward");
    assert_eq!(rows["malformed"], "drop");
    assert!(documented(
        "| Reason | Action |\n| --- | --- |\n| `direct` | forward |\n| `direct` | forward |\n"
    )
    .is_err());
}
