//! What a scenario measured: its table rows, its JSON and its problems.

use serde_json::{json, Value};

/// What a scenario measured.
pub struct Outcome {
    pub scenario: String,
    pub rows: Vec<(String, String)>,
    pub json: Value,
    pub problems: Vec<String>,
}

impl Outcome {
    pub fn new(scenario: &str) -> Outcome {
        Outcome {
            scenario: scenario.into(),
            rows: Vec::new(),
            json: json!({ "scenario": scenario }),
            problems: Vec::new(),
        }
    }

    pub fn row(&mut self, key: &str, shown: String, value: Value) {
        self.rows.push((key.into(), shown));
        self.json[key] = value;
    }

    pub fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            self.problems.push(what.into());
        }
    }

    pub fn print(&self) {
        let w = self.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        println!("\n== {} ==", self.scenario);
        for (k, v) in &self.rows {
            println!("  {k:<w$}  {v}");
        }
        for p in &self.problems {
            println!("  PROBLEM: {p}");
        }
    }

    pub fn save(&self) {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("bench");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{}.json", self.scenario));
        let text = serde_json::to_string_pretty(&self.json).expect("json");
        match std::fs::write(&path, text) {
            Ok(()) => println!("  -> {}", path.display()),
            Err(e) => println!("  (could not write {}: {e})", path.display()),
        }
    }
}
