//! The one-time sign-in link printed at first start.

use axum::extract::{Path, State};
use axum::response::{Html, IntoResponse};

use super::accounts::{
    ClientInfo, PASSWORD_FIELD, SIGN_IN_LATER, api_session, chosen_password, keep_password, password_refused,
};
use super::page::{gone, page, token_page};
use crate::access::tokens;
use crate::state::AppState;

pub(crate) async fn login_page(Path(code): Path<String>) -> Html<String> {
    let _ = code;
    page(
        "Sign in",
        &format!(
            "<p>This single-use link signs you in as the administrator created at first start.</p>\
             <form method=\"post\">{PASSWORD_FIELD}<button type=\"submit\">Sign in and show my token</button></form>"
        ),
    )
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct LoginForm {
    #[serde(default)]
    password: String,
}

pub(crate) async fn login(
    State(state): State<AppState>,
    client: ClientInfo,
    Path(code): Path<String>,
    form: Result<axum::Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> axum::response::Response {
    let password = match chosen_password(&form.map(|f| f.0).unwrap_or_default().password) {
        Ok(p) => p,
        Err(why) => return password_refused(&why),
    };
    let user_id = match state.store.redeem_login_code(&tokens::hash(&code)).await {
        Ok(Some(u)) => u,
        Ok(None) => return gone("sign-in"),
        Err(e) => return crate::error::ApiError::from(e).into_response(),
    };
    let later = if keep_password(&state, &user_id, password).await { SIGN_IN_LATER } else { "" };
    match api_session(&state, &user_id, "browser sign-in", &client).await {
        Ok(token) => {
            token_page("Signed in", &format!("You are signed in as the administrator. {later}"), &token).into_response()
        }
        Err(e) => e.into_response(),
    }
}
