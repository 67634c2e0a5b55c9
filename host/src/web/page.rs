//! What every page shares: the shell and its escaping, the headers that
//! forbid framing, caching and sniffing, and the content security policy.

use axum::response::{Html, IntoResponse};
use secrecy::{ExposeSecret, SecretString};

/// The content security policy of pages whose forms post only here.
pub(crate) const CSP_FORMS_TO_SELF: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The same policy, letting forms (and the redirects they lead to) also
/// reach `origin`, which the caller has checked.
pub(crate) fn csp_with_form_target(origin: &str) -> axum::http::HeaderValue {
    let policy = CSP_FORMS_TO_SELF.replace("form-action 'self'", &format!("form-action 'self' {origin}"));
    axum::http::HeaderValue::from_str(&policy).unwrap_or(axum::http::HeaderValue::from_static(CSP_FORMS_TO_SELF))
}

/// Headers of every page: no framing (clickjacking), no caching (pages
/// show one-time tokens and handles), no sniffing, no scripts, forms only
/// to this server, and no referrer carrying a link's code elsewhere.
pub(crate) async fn page_headers(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    // A page whose form must lead elsewhere (the CLI's loopback address)
    // sets its own policy, differing only in `form-action`.
    h.entry(header::CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(CSP_FORMS_TO_SELF));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

/// Escapes text for HTML element and attribute content.
pub(crate) fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '&' => "&amp;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// A minimal page; `body` must already be escaped.
pub(crate) fn page(title: &str, body: &str) -> Html<String> {
    page_with_style(title, "", body)
}

/// A page with CSS of its own after the shared rules (wider, for tables,
/// when it has any); `body` must already be escaped.
pub(crate) fn page_with_style(title: &str, style: &str, body: &str) -> Html<String> {
    let width = if style.is_empty() { "40rem" } else { "64rem" };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"referrer\" content=\"no-referrer\">\
         <meta name=\"viewport\" content=\"width=device-width\"><title>{t}</title>\
         <style>body{{font-family:system-ui,sans-serif;max-width:{width};margin:3rem auto;padding:0 1rem;line-height:1.45}}\
         code{{word-break:break-all;background:#f3f3f3;padding:.2rem .4rem}}\
         input{{font:inherit;padding:.3rem;min-width:18rem}}button{{font:inherit;padding:.35rem .9rem}}{style}</style></head>\
         <body><h1>{t}</h1>{body}</body></html>",
        t = escape(title)
    ))
}

pub(crate) fn gone(what: &str) -> axum::response::Response {
    (
        axum::http::StatusCode::GONE,
        page("Link not valid", &format!("<p>This {} link is unknown, expired or already used.</p>", escape(what))),
    )
        .into_response()
}

pub(crate) fn token_page(title: &str, intro: &str, token: &SecretString) -> Html<String> {
    page(
        title,
        &format!(
            "<p>{}</p><p>Your API token (shown once; store it like a password):</p><p><code>{}</code></p>\
             <p>Use it as <code>Authorization: Bearer &lt;token&gt;</code>.</p>",
            escape(intro),
            escape(token.expose_secret())
        ),
    )
}
