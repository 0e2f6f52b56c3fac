//! The OpenAPI 3.1 document, generated from the route table and the wire
//! types' JSON Schemas.

use serde_json::{json, Map, Value};

use crate::api::ErrorReply;
use crate::route::{Payload, Route};

/// The OpenAPI document of the API whose endpoints are `routes`.
pub(crate) fn document(routes: &[Route]) -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    let mut generator = settings.into_generator();
    let error = generator.subschema_for::<ErrorReply>();
    let mut paths = Map::new();
    for route in routes {
        let mut parameters = Vec::new();
        for part in route.path.split('/') {
            if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                parameters.push(json!({
                    "name": name, "in": "path", "required": true, "schema": {"type": "string"}
                }));
            }
        }
        for (name, required, description) in route.query {
            parameters.push(json!({
                "name": name, "in": "query", "required": required,
                "description": description, "schema": {"type": "string"}
            }));
        }
        let content = |payload: Payload, generator: &mut schemars::SchemaGenerator| match payload {
            Payload::Empty => None,
            Payload::Json(schema) => {
                Some(json!({"application/json": {"schema": schema(generator)}}))
            }
            Payload::Lines(schema) => Some(json!({
                "application/x-ndjson": {"schema": schema(generator)}
            })),
            Payload::Bytes(media) => {
                Some(json!({media: {"schema": {"type": "string", "format": "binary"}}}))
            }
        };
        let mut operation = Map::new();
        operation.insert("summary".into(), json!(route.summary));
        operation.insert(
            "operationId".into(),
            json!(format!(
                "{}{}",
                route.method.as_str().to_ascii_lowercase(),
                route
                    .path
                    .trim_start_matches("/v1")
                    .replace(['{', '}', '.'], "")
                    .replace('/', "_")
            )),
        );
        if !parameters.is_empty() {
            operation.insert("parameters".into(), Value::Array(parameters));
        }
        if let Some(c) = content(route.request, &mut generator) {
            operation.insert(
                "requestBody".into(),
                json!({"required": true, "content": c}),
            );
        }
        let mut ok = json!({"description": "Done."});
        if let Some(c) = content(route.reply, &mut generator) {
            ok["content"] = c;
        }
        operation.insert(
            "responses".into(),
            json!({
                "200": ok,
                "default": {
                    "description": "What failed: a status and an error body.",
                    "content": {"application/json": {"schema": error.clone()}}
                }
            }),
        );
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = entry {
            m.insert(
                route.method.as_str().to_ascii_lowercase(),
                Value::Object(operation),
            );
        }
    }
    let schemas = generator.take_definitions(true);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Berth API",
            "version": crate::api::API_VERSION.to_string(),
            "description": "Sandboxes for AI-agent workspaces. Served by `berth serve` on a unix socket (mode 0600) or, with --listen, on loopback TCP with a bearer token. Bytes that may not be UTF-8 travel as base64 in `data` fields."
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        "security": [{}, {"bearer": []}]
    })
}

#[cfg(test)]
mod tests {
    /// The committed document (`host/server/openapi.json`) is what the code
    /// generates. `BERTH_BLESS=1 cargo test -p berth-server` rewrites it.
    #[test]
    fn the_committed_document_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        let generated = serde_json::to_string_pretty(&crate::openapi()).unwrap() + "\n";
        if std::env::var_os("BERTH_BLESS").is_some() {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "{} differs from the API the code serves: run `BERTH_BLESS=1 cargo test -p berth-server` and commit it",
            path.display()
        );
    }

    #[test]
    fn every_route_is_documented_with_its_schemas() {
        let doc = crate::openapi();
        let paths = doc["paths"].as_object().unwrap();
        for route in crate::routes::table() {
            let op = &paths[route.path][route.method.as_str().to_ascii_lowercase()];
            assert!(op.is_object(), "{} {} missing", route.method, route.path);
        }
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "ExecBody",
            "ExecLine",
            "CreateSandbox",
            "ErrorReply",
            "Process",
        ] {
            assert!(schemas.contains_key(name), "schema {name} missing");
        }
    }
}
