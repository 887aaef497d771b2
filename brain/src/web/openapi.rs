//! The OpenAPI 3.1 document at `/api/openapi.json`, made from the route table the router is
//! made from (`routes::table`): every route, its method, the role it needs, its
//! path parameters, what it takes and what it answers (named after the `tether.v1` messages
//! whose JSON form it speaks), the two ways to authenticate and the error shape.

use axum::routing::MethodRouter;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Value, json};

use super::Web;

/// The least role a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Viewer,
    Operator,
}

/// What a route takes or answers.
#[derive(Clone, Copy)]
pub enum Shape {
    /// JSON of a type, its schema generated from the type.
    Json(fn(&mut SchemaGenerator) -> Schema),
    Text,
    Bytes,
    /// Server-Sent Events (or NDJSON): records as `brain task log --json` prints them.
    Events,
}

/// The schema of `T` (a reference to its entry under `components/schemas`).
pub fn of<T: JsonSchema>() -> Shape {
    Shape::Json(|g| g.subschema_for::<T>())
}

/// One route: how it is called and what it does.
pub struct Doc {
    pub method: &'static str,
    /// Below `/api`, with `{param}`s.
    pub path: &'static str,
    pub role: Role,
    pub summary: &'static str,
    /// Its query parameters: the properties of this type's schema.
    pub query: Option<fn(&mut SchemaGenerator) -> Schema>,
    pub body: Option<Shape>,
    pub answer: Shape,
    pub handler: MethodRouter<Web>,
}

impl Doc {
    pub fn new(
        method: &'static str,
        path: &'static str,
        role: Role,
        summary: &'static str,
        body: Option<Shape>,
        answer: Shape,
        handler: MethodRouter<Web>,
    ) -> Self {
        Self {
            method,
            path,
            role,
            summary,
            query: None,
            body,
            answer,
            handler,
        }
    }

    /// The route takes query parameters: the fields of `T`.
    pub fn query<T: JsonSchema>(mut self) -> Self {
        self.query = Some(|g| g.root_schema_for::<T>());
        self
    }
}

fn content(g: &mut SchemaGenerator, shape: Shape) -> Value {
    match shape {
        Shape::Json(f) => json!({"application/json": {"schema": f(g)}}),
        Shape::Text => json!({"text/plain": {"schema": {"type": "string"}}}),
        Shape::Bytes => {
            json!({"application/octet-stream": {"schema": {"type": "string", "contentMediaType": "application/octet-stream"}}})
        }
        Shape::Events => json!({
            "text/event-stream": {"schema": {"type": "string", "description": "events `record` (id: the sequence number; data: the record's JSON), `live` (no id, not durable), `broken`, `end`; `tasks` and `task` on /api/events"}},
            "application/x-ndjson": {"schema": {"type": "string", "description": "with follow=false: one record's JSON per line"}},
        }),
    }
}

/// The document for the routes in `table`.
pub fn build(table: &[Doc]) -> Value {
    let mut g = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let mut paths = serde_json::Map::new();
    for d in table {
        let mut params: Vec<Value> = d
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|p| json!({"name": p, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if let Some(q) = d.query {
            let schema = q(&mut g).to_value();
            for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
                let mut prop = prop.clone();
                let description = prop
                    .as_object_mut()
                    .and_then(|o| o.remove("description"))
                    .unwrap_or(Value::Null);
                params.push(json!({"name": name, "in": "query", "required": false, "schema": prop, "description": description}));
            }
        }
        let mut op = json!({
            "summary": d.summary,
            "operationId": format!("{} {}", d.method, d.path),
            "x-tether-role": match d.role { Role::Viewer => "viewer", Role::Operator => "operator" },
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": content(&mut g, d.answer)},
                "default": {"description": "An error: what failed and what to do", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        });
        if let Some(b) = d.body {
            op["requestBody"] = json!({"content": content(&mut g, b)});
        }
        let entry = paths
            .entry(format!("/api{}", d.path))
            .or_insert_with(|| json!({}));
        entry[d.method.to_lowercase()] = op;
    }
    let mut schemas: serde_json::Map<String, Value> = g.take_definitions(true);
    schemas.insert(
        "Error".into(),
        json!({"type": "object", "required": ["error"], "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}),
    );
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Tether brain", "version": env!("CARGO_PKG_VERSION")},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
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

#[cfg(test)]
mod tests {
    #[test]
    fn every_route_is_documented_once_with_its_parameters() {
        let table = super::super::routes::table();
        let doc = super::build(&table);
        let mut n = 0;
        for d in &table {
            let op = &doc["paths"][format!("/api{}", d.path)][d.method.to_lowercase()];
            assert!(op.is_object(), "{} {} missing", d.method, d.path);
            let params = op["parameters"].as_array().unwrap();
            let in_path = params.iter().filter(|p| p["in"] == "path").count();
            assert_eq!(in_path, d.path.matches('{').count());
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
        // Every reference resolves to a schema generated from a type.
        let text = doc.to_string();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{name} is referenced and not defined"
            );
        }
        let create = &doc["components"]["schemas"]["RunAgentRequest"];
        assert_eq!(create["properties"]["goal"]["type"], "string", "{create}");
        // 64-bit integers are strings, as the API writes them (proto3's JSON mapping);
        // 32-bit ones stay numbers.
        let summary = &doc["components"]["schemas"]["TaskSummary"]["properties"];
        for wide in ["tokens", "created_unix_ms", "updated_unix_ms"] {
            assert_eq!(summary[wide]["type"], "string", "{wide}: {summary}");
            assert_eq!(summary[wide]["pattern"], "^-?[0-9]+$", "{wide}: {summary}");
        }
        assert_eq!(summary["steps_done"]["type"], "integer", "{summary}");
        assert_eq!(
            create["properties"]["check_timeout_ms"]["type"], "string",
            "{create}"
        );
        let list = &doc["paths"]["/api/tasks"]["get"]["parameters"];
        assert!(
            list.as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "status"),
            "{list}"
        );
    }
}
