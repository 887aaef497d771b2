//! The OpenAPI 3.1 document at `/api/openapi.json`, made from the route table the router is
//! made from ([`super::routes::table`]): every route, its method, the role it needs, its
//! path parameters, what it takes and what it answers (named after the `tether.v1` messages
//! whose JSON form it speaks), the two ways to authenticate and the error shape.

use axum::Json;
use axum::routing::MethodRouter;
use serde_json::{Value, json};

use super::Web;

/// The least role a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Viewer,
    Operator,
}

/// One route: how it is called and what it does.
pub struct Doc {
    pub method: &'static str,
    /// Below `/api`, with `{param}`s.
    pub path: &'static str,
    pub role: Role,
    pub summary: &'static str,
    pub body: Option<&'static str>,
    pub answer: &'static str,
    pub handler: MethodRouter<Web>,
}

impl Doc {
    pub fn new(
        method: &'static str,
        path: &'static str,
        role: Role,
        summary: &'static str,
        body: Option<&'static str>,
        answer: &'static str,
        handler: MethodRouter<Web>,
    ) -> Self {
        Self {
            method,
            path,
            role,
            summary,
            body,
            answer,
            handler,
        }
    }
}

fn schema(name: &str) -> Value {
    match name {
        "Text" => json!({"type": "string"}),
        "Bytes" => json!({"type": "string", "contentEncoding": "binary"}),
        "Empty" => json!({"type": "object"}),
        _ => json!({"$ref": format!("#/components/schemas/{name}")}),
    }
}

fn media(name: &str) -> &'static str {
    match name {
        "Text" => "text/plain",
        "Bytes" => "application/octet-stream",
        "Record" | "TaskSummary" => "application/json",
        _ => "application/json",
    }
}

/// The document.
pub fn build() -> Value {
    let mut paths = serde_json::Map::new();
    let mut names = std::collections::BTreeSet::new();
    for d in super::routes::table() {
        let params: Vec<Value> = d
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|p| json!({"name": p, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": d.summary,
            "operationId": format!("{} {}", d.method, d.path),
            "x-tether-role": match d.role { Role::Viewer => "viewer", Role::Operator => "operator" },
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": {media(d.answer): {"schema": schema(d.answer)}}},
                "default": {"description": "An error: what failed and what to do", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        });
        if d.path.ends_with("/events") {
            op["responses"]["200"]["content"]["text/event-stream"] =
                json!({"schema": {"type": "string"}});
        }
        if let Some(b) = d.body {
            op["requestBody"] = json!({"content": {"application/json": {"schema": schema(b)}}});
            names.insert(b);
        }
        if !matches!(d.answer, "Text" | "Bytes" | "Empty") {
            names.insert(d.answer);
        }
        let entry = paths
            .entry(format!("/api{}", d.path))
            .or_insert_with(|| json!({}));
        entry[d.method.to_lowercase()] = op;
    }
    let mut schemas = serde_json::Map::new();
    for n in names {
        schemas.insert(
            n.to_string(),
            json!({"type": "object", "description": format!("The JSON form of tether.v1.{n} (absent fields take their defaults)")}),
        );
    }
    schemas.insert(
        "Error".into(),
        json!({"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}),
    );
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Tether brain", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "`brain admin token create`"},
                "session": {"type": "apiKey", "in": "cookie", "name": super::SESSION_COOKIE, "description": "`brain web login`; changes also send X-Tether-CSRF"},
            },
        },
        "security": [{"bearer": []}, {"session": []}],
    })
}

pub async fn document() -> Json<Value> {
    Json(build())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_route_is_documented_once_with_its_parameters() {
        let doc = super::build();
        let table = super::super::routes::table();
        let mut n = 0;
        for d in &table {
            let op = &doc["paths"][format!("/api{}", d.path)][d.method.to_lowercase()];
            assert!(op.is_object(), "{} {} missing", d.method, d.path);
            assert_eq!(
                op["parameters"].as_array().unwrap().len(),
                d.path.matches('{').count()
            );
            n += 1;
        }
        let documented: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p.as_object().unwrap().len())
            .sum();
        assert_eq!(documented, n);
        assert_eq!(doc["openapi"], "3.1.0");
    }
}
