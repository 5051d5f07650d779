from django.contrib import admin

from .models import Balance, Grant, Order

admin.site.register(Grant)
admin.site.register(Balance)
admin.site.register(Order)
