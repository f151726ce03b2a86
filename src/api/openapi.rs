//! The OpenAPI 3.1 contract served at `GET /api/openapi.json` (no token).
//! Each route's path, parameters, body and answers come from its handler's
//! `#[utoipa::path]` (registered with `routes!`, so the router and the
//! document share one source); what every route has in common is added here
//! once: the bearer token, the space and act-as headers (act-as only on the
//! routes of [`ACT_AS_ROUTES`]), and the error answers the auth step, the
//! extractors and the limits can give, all with the one `ErrorBody` schema.
//!
//! Must never: document a route the router does not serve, or leave a served
//! route out (tests/it/openapi.rs checks both).

use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, ObjectBuilder, OpenApi, Ref, Required, ResponseBuilder, Type,
};
use utoipa::OpenApi as _;

use super::act_as::find_route;
use super::auth::{ACT_AS_HEADER, SPACE_HEADER};
use super::error::{ErrorBody, ErrorDetail};

/// The name of the bearer security scheme in the document.
pub const BEARER: &str = "bearer";

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Mercury API",
        description = "The HTTP API of a Mercury host. Every `/api/*` route but this document \
                       needs `Authorization: Bearer <token>`; space routes take the space from \
                       `x-mercury-space` (or a run token). Every error answer is an `ErrorBody`. \
                       See docs/api.md."
    ),
    components(schemas(ErrorBody, ErrorDetail))
)]
struct ApiDoc;

/// What every authenticated route can answer besides its own outcomes.
const AUTHED_ERRORS: &[(&str, &str)] = &[
    (
        "400",
        "A malformed header, path segment, query or body, or a rule of the route refused",
    ),
    ("401", "No, an unknown, a revoked or an expired token"),
    (
        "403",
        "The caller may not do this here (a missing permission is named)",
    ),
    (
        "404",
        "The space (x-mercury-space) or the thing named in the path does not exist",
    ),
    ("414", "The path and query are longer than 8 KiB"),
    (
        "500",
        "An internal failure (the detail is in the host log, never here)",
    ),
];

/// What a route that takes a JSON body can answer besides.
const BODY_ERRORS: &[(&str, &str)] = &[
    ("413", "The body is larger than http.body_limit_bytes"),
    (
        "415",
        "The body is not sent as content-type: application/json",
    ),
];

/// A write goes through the space's actor, which may be restarting or slow.
const WRITE_ERRORS: &[(&str, &str)] =
    &[("503", "The space did not answer in time, or is restarting")];

/// The whole document: `api` (the authenticated routes) decorated with what
/// they share, and `public` (health, this document) as they are.
pub fn contract(mut api: OpenApi, public: OpenApi) -> OpenApi {
    for (path, item) in &mut api.paths.paths {
        for (method, op) in operations(item) {
            decorate(path, method, op);
        }
    }
    // axum's catch-all `{*path}` is OpenAPI's `{path}` (the segment may hold slashes).
    api.paths.paths = std::mem::take(&mut api.paths.paths)
        .into_iter()
        .map(|(path, item)| (openapi_path(&path), item))
        .collect();
    let mut doc = ApiDoc::openapi();
    doc.merge(api);
    doc.merge(public);
    let scheme = SecurityScheme::Http(
        HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "A user, adapter or run token (`mercury init` writes the owner's)",
            ))
            .build(),
    );
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(BEARER, scheme);
    doc
}

/// A route's path as OpenAPI writes it: `/api/files/{*path}` is `/api/files/{path}`.
pub fn openapi_path(route: &str) -> String {
    route.replace("{*", "{")
}

/// The operations of a path with their upper-case methods.
pub fn operations(item: &mut PathItem) -> Vec<(&'static str, &mut Operation)> {
    [
        ("GET", item.get.as_mut()),
        ("PUT", item.put.as_mut()),
        ("POST", item.post.as_mut()),
        ("DELETE", item.delete.as_mut()),
        ("PATCH", item.patch.as_mut()),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.map(|op| (m, op)))
    .collect()
}

fn decorate(path: &str, method: &str, op: &mut Operation) {
    op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
    let params = op.parameters.get_or_insert_with(Vec::new);
    params.push(header(
        SPACE_HEADER,
        "The space the request acts in (space routes; a run token names its own)",
    ));
    if let Some(entry) = find_route(method, path) {
        params.push(header(
            ACT_AS_HEADER,
            &format!(
                "Act in this space through a space link from the x-mercury-space space \
                 (needs links.act there and a link at level '{}' or higher)",
                entry.level.as_str()
            ),
        ));
    }
    let mut errors: Vec<(&str, &str)> = AUTHED_ERRORS.to_vec();
    if op.request_body.is_some() {
        errors.extend_from_slice(BODY_ERRORS);
    }
    if method != "GET" {
        errors.extend_from_slice(WRITE_ERRORS);
    }
    for (status, why) in errors {
        op.responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| error_response(why).into());
    }
}

fn header(name: &str, description: &str) -> utoipa::openapi::path::Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .build()
}

fn error_response(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}
