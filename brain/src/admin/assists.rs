//! `brain config assists [MODEL]`: the agent loop's assists, what each does and why, and
//! which are on for a model as the config file sets them.

use serde_json::json;

use crate::model::assists::{Assists, REGISTRY};

/// Prints the registry with the assists `model` (default: the config's default model) gets;
/// exit 78 when the config file is invalid.
pub fn show(path: &std::path::Path, model: Option<String>, json: bool) -> anyhow::Result<i32> {
    let config = if path.exists() {
        match crate::config::Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                err!("error: {e}");
                return Ok(shared::exit::ExitCode::Config.code());
            }
        }
    } else {
        crate::config::Config::default()
    };
    let model = model.or_else(|| config.llm.default_model.clone());
    let on = match &model {
        Some(m) => match Assists::for_model(m, &config.llm, None) {
            Ok(a) => Some(a),
            Err(e) => {
                err!("error: {e}");
                return Ok(shared::exit::ExitCode::Config.code());
            }
        },
        None => None,
    };
    if json {
        let rows: Vec<_> = REGISTRY
            .iter()
            .map(|e| {
                json!({
                    "name": e.name,
                    "family": e.family,
                    "changes": e.changes.as_str(),
                    "native_default": e.native,
                    "on": on.as_ref().map(|a| a.on(e.assist)),
                    "what": e.what,
                    "why": e.why,
                })
            })
            .collect();
        out!("{}", json!({"model": model, "assists": rows}));
        return Ok(0);
    }
    match (&model, &on) {
        (Some(m), Some(a)) => out!(
            "{m}: {} of {} assists on ({})",
            a.iter().count(),
            REGISTRY.len(),
            if a.iter().count() == 0 {
                "none".to_string()
            } else {
                a.names().join(", ")
            }
        ),
        _ => out!("no model given and no default model: ON is not shown (pass MODEL)"),
    }
    out!("");
    out!(
        "{:<20} {:<13} {:<9} {:<4} WHAT / WHY",
        "NAME",
        "FAMILY",
        "CHANGES",
        "ON"
    );
    for e in REGISTRY {
        let mark = match &on {
            Some(a) if a.on(e.assist) => "yes",
            Some(_) => "no",
            None => "-",
        };
        out!(
            "{:<20} {:<13} {:<9} {:<4} {}",
            e.name,
            e.family,
            e.changes.as_str(),
            mark,
            squash(e.what)
        );
        out!("{:<50}why: {}", "", squash(e.why));
    }
    Ok(0)
}

/// The registry's text with its source line breaks' runs of spaces made one.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
